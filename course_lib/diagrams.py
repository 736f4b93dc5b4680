"""Pictures of collectives: what each rank holds before and after (notebook 04 introduces them).

    collective_picture("all_reduce", world_size=4)     the standard collectives, symbolically
    draw_collective(before, after, title)              any before/after you describe yourself
    draw_ring_all_reduce(world_size=4)                 the ring algorithm, step by step
    draw_barrier(arrivals)                             ranks arrive at different times, leave together

Each function returns a matplotlib `Figure` (not a pyplot one, so nothing accumulates); a notebook shows
it once, as a picture without an `Out[n]:` prompt, whether it ends the cell or is passed to `display`.
In a script, call `fig.savefig(path)`.

A rank's data is drawn as a row of cells. A cell is a label, a `Cell`, or None (nothing there).
Letters name the rank a piece comes from (A from rank 0, B from rank 1, ...), digits name the
chunk (A2 is chunk 2 of rank 0's tensor); a cell that combines several ranks' pieces is drawn in
gold, with the contributors listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from course_lib.tables import plural

__all__ = ["Cell", "Picture", "draw_collective", "collective_picture", "COLLECTIVES", "ring_all_reduce_states",
           "draw_ring_all_reduce", "draw_barrier", "rank_letter"]

# One colour per source rank (colour-blind-safe Okabe–Ito palette), gold for reduced values.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999"]
REDUCED = "#F2C14E"
EMPTY_EDGE = "#BBBBBB"


@dataclass
class Cell:
    """One piece of a rank's data in a picture: a label and where it came from (notebook 04)."""

    label: str
    sources: tuple[int, ...] = ()  # ranks whose data is in it; more than one means reduced
    highlight: bool = False  # drawn with a thick outline (e.g. the chunk being sent)


CellLike = Union[str, Cell, None]


class Picture(Figure):
    """A matplotlib Figure that a notebook shows as a plain picture, without an `Out[n]:` prompt (notebook 04)."""

    def _ipython_display_(self) -> None:
        # IPython calls this instead of formatting the cell's value as a result: the PNG goes out as display
        # data, the way plt.show() shows a figure, so no "Out[n]:" is printed beside it.
        from IPython.core.pylabtools import print_figure
        from IPython.display import display

        display({"image/png": print_figure(self, "png", bbox_inches="tight", base64=True),
                 "text/plain": f"<picture: {self.get_suptitle() or 'figure'}>"}, raw=True)


def rank_letter(rank: int) -> str:
    """The letter that names rank `rank`'s data in the pictures: A, B, C, ... (notebook 04)."""
    return chr(ord("A") + rank) if rank < 26 else f"R{rank}"


def _as_cell(value: CellLike) -> Cell | None:
    if value is None or isinstance(value, Cell):
        return value
    text = str(value)
    if text and text[0].isalpha() and text[0].isupper() and not text.startswith("Σ"):
        return Cell(text, (ord(text[0]) - ord("A"),))
    return Cell(text, ())


def _colour(cell: Cell) -> str:
    if len(cell.sources) == 1:
        return PALETTE[cell.sources[0] % len(PALETTE)]
    if len(cell.sources) > 1:
        return REDUCED
    return "#DDDDDD"


def _draw_ranks(ax, rows: Sequence[Sequence[CellLike]], title: str, width: int, show_rank_labels: bool = True) -> None:
    """Draw one panel: a row of cells per rank, rank 0 at the top."""
    n = len(rows)
    for rank, row in enumerate(rows):
        y = n - 1 - rank
        if show_rank_labels:
            ax.text(-0.25, y + 0.4, f"rank {rank}", ha="right", va="center", fontsize=10)
        for i in range(width):
            cell = _as_cell(row[i]) if i < len(row) else None
            if cell is None:
                ax.add_patch(Rectangle((i, y), 0.92, 0.8, facecolor="white", edgecolor=EMPTY_EDGE, linestyle=":"))
                continue
            light = len(cell.sources) == 1 and cell.sources[0] % len(PALETTE) in (1, 4, 6)
            ax.add_patch(Rectangle((i, y), 0.92, 0.8, facecolor=_colour(cell),
                                   edgecolor="black", linewidth=2.5 if cell.highlight else 0.8))
            size = 11 if len(cell.label) <= 3 else 9 if len(cell.label) <= 4 else 7.5 if len(cell.label) <= 6 else 6.5
            ax.text(i + 0.46, y + 0.4, cell.label, ha="center", va="center", fontsize=size,
                    color="black" if light or len(cell.sources) != 1 else "white", fontweight="bold")
    ax.set_xlim(-1.3 if show_rank_labels else -0.05, width + 0.05)  # labels get 1.25 units of room to the left
    ax.set_ylim(-0.2, n)
    ax.set_title(title, fontsize=11)
    ax.set_axis_off()


def draw_collective(
    before: Sequence[Sequence[CellLike]],
    after: Sequence[Sequence[CellLike]],
    title: str = "",
    note: str = "",
    arrow: str = "",
) -> Picture:
    """A before/after picture: one row of cells per rank on each side, a labelled arrow between (notebook 04).

    before[r] and after[r] are the cells rank r holds; a cell is a label like "A2", a `Cell`, or None.
    `arrow` is written over the arrow (e.g. the call that turns before into after).
    """
    if len(before) != len(after):
        raise ValueError(f"before has {plural(len(before), 'rank')} but after has {len(after)}")
    width = max([len(r) for r in [*before, *after]] + [1])
    n = len(before)
    fig = Picture(figsize=(3.6 + 1.25 * width, 0.55 * n + (1.3 if note else 1.0)), layout="constrained")
    left, middle, right = fig.subplots(1, 3, gridspec_kw={"width_ratios": [width + 1.35, 2.1, width + 1.35]})
    _draw_ranks(left, before, "before", width)
    _draw_ranks(right, after, "after", width)
    middle.set_xlim(0, 1)
    middle.set_ylim(-0.2, n)
    middle.set_axis_off()
    middle.add_patch(FancyArrowPatch((0.04, n / 2 - 0.1), (0.96, n / 2 - 0.1), arrowstyle="-|>", mutation_scale=22,
                                     linewidth=2.2, color="#444444"))
    if arrow:
        middle.text(0.5, n / 2 + 0.15, arrow, ha="center", va="bottom", fontsize=9.5, family="monospace",
                    color="#222222")
    if title:
        fig.suptitle(title, fontsize=12, fontweight="bold")
    if note:
        fig.supxlabel(note, fontsize=9.5, color="#444444")
    return fig


def _reduced(chunk: int | None, world_size: int) -> Cell:
    label = "Σ" if chunk is None else f"Σ{chunk}"
    return Cell(label, tuple(range(world_size)))


def _collective_states(name: str, n: int, root: int) -> tuple[list, list, str]:
    letters = [rank_letter(r) for r in range(n)]
    whole = [[letters[r]] for r in range(n)]
    chunked = [[f"{letters[r]}{c}" for c in range(n)] for r in range(n)]
    if name == "broadcast":
        before = [[letters[root]] if r == root else [None] for r in range(n)]
        return before, [[letters[root]] for _ in range(n)], f"rank {root}'s tensor is copied to every rank"
    if name == "reduce":
        after = [[_reduced(None, n)] if r == root else [letters[r]] for r in range(n)]
        return whole, after, f"Σ = {' + '.join(letters)}, on rank {root} only (the others keep their input)"
    if name == "all_reduce":
        return whole, [[_reduced(None, n)] for _ in range(n)], (
            f"Σ = {' op '.join(letters)} with op = SUM, AVG, MAX, ...; every rank gets it")
    if name == "all_gather":
        return whole, [list(letters) for _ in range(n)], "every rank gets every rank's tensor, in rank order"
    if name == "reduce_scatter":
        after = [[_reduced(r, n)] for r in range(n)]
        return chunked, after, f"Σk = {' + '.join(f'{l}k' for l in letters)}: rank k gets the sum of chunk k only"
    if name == "all_to_all":
        after = [[f"{letters[s]}{r}" for s in range(n)] for r in range(n)]
        return chunked, after, "rank r sends its chunk k to rank k: a transpose across ranks"
    if name == "scatter":
        before = [[f"{letters[root]}{c}" for c in range(n)] if r == root else [None] for r in range(n)]
        return before, [[f"{letters[root]}{r}"] for r in range(n)], f"rank {root}'s chunk k goes to rank k"
    if name == "gather":
        after = [list(letters) if r == root else [None] for r in range(n)]
        return whole, after, f"rank {root} collects every rank's tensor"
    raise ValueError(f"no picture for {name!r}; known: {', '.join(COLLECTIVES)}")


COLLECTIVES = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "scatter", "gather")


_CALLS = {"broadcast": "src={root}", "reduce": "dst={root}", "all_reduce": "op=SUM", "scatter": "src={root}",
          "gather": "dst={root}", "reduce_scatter": "op=SUM"}


def collective_picture(name: str, world_size: int = 4, root: int = 0) -> Picture:
    """The before/after picture of collective `name` (one of COLLECTIVES) in `world_size` ranks (notebook 04)."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    before, after, note = _collective_states(name, world_size, root)
    call = f"{name}({_CALLS.get(name, '').format(root=root)})"
    return draw_collective(before, after, f"dist.{name}", note, arrow=call)


def ring_all_reduce_states(world_size: int) -> list[tuple[str, list[list[Cell]]]]:
    """Every rank's chunks after each step of a ring all-reduce, as (caption, rows of Cells) (notebook 04).

    Rank r sends only to rank (r + 1) % n, which adds the chunk to its own copy (reduce-scatter) or
    overwrites its copy with it (all-gather). A highlighted cell is one that is sent in the next step.
    (Which chunk is sent in which step is exercise 04's to work out from the picture.)
    """
    n = world_size
    held = [[{r} for _ in range(n)] for r in range(n)]  # held[rank][chunk] = ranks summed in

    def snapshot(caption: str, sending: dict[int, int]) -> tuple[str, list[list[Cell]]]:
        rows = []
        for r in range(n):
            row = []
            for c in range(n):
                sources = tuple(sorted(held[r][c]))
                label = rank_letter(sources[0]) + str(c) if len(sources) == 1 else (
                    f"Σ{c}" if len(sources) == n else "+".join(rank_letter(s) for s in sources) + str(c))
                row.append(Cell(label, sources, highlight=sending.get(r) == c))
            rows.append(row)
        return caption, rows

    states = [snapshot("start", {r: r % n for r in range(n)} if n > 1 else {})]
    for step in range(n - 1):
        sent = {r: (r - step) % n for r in range(n)}
        incoming = {(r + 1) % n: set(held[r][c]) for r, c in sent.items()}
        for dst, sources in incoming.items():
            held[dst][sent[(dst - 1) % n]] |= sources
        nxt = {r: (r - step - 1) % n for r in range(n)} if step < n - 2 else {r: (r + 1) % n for r in range(n)}
        states.append(snapshot(f"reduce-scatter {step + 1}", nxt))
    for step in range(n - 1):
        sent = {r: (r + 1 - step) % n for r in range(n)}
        for r, c in sent.items():
            held[(r + 1) % n][c] = set(held[r][c])
        nxt = {r: (r - step) % n for r in range(n)} if step < n - 2 else {}
        states.append(snapshot(f"all-gather {step + 1}", nxt))
    return states


def draw_ring_all_reduce(world_size: int = 4) -> Picture:
    """The ring all-reduce, step by step: reduce-scatter steps on the top row, all-gather on the bottom (notebook 04)."""
    states = ring_all_reduce_states(world_size)
    n = world_size
    # Rank labels only in the first column, which is wider by their room, so every cell has the same size.
    fig = Picture(figsize=(min(11.5, 1.2 + 0.62 * n * n), 2 * (0.55 * n + 0.75) + 0.8), layout="constrained")
    axes = fig.subplots(2, n, squeeze=False, gridspec_kw={"width_ratios": [n + 1.35] + [n + 0.1] * (n - 1)})
    rows_of_panels = [states[:n], states[n:]]  # start and the n-1 reduce-scatter steps; the n-1 all-gather steps
    for row, panels in enumerate(rows_of_panels):
        for column, (caption, cells) in enumerate(panels):
            _draw_ranks(axes[row][column], cells, caption, n, show_rank_labels=column == 0)
            axes[row][column].title.set_fontsize(10)
    last = axes[1][n - 1]
    last.set_axis_off()
    if n > 1:
        last.text(0.05, 0.5, f"Σk: chunk k summed\nover all {plural(n, 'rank')}.\n\nEach step moves\n1/{n} of the tensor\n"
                  "per rank.", ha="left", va="center", fontsize=9.5, color="#333333", transform=last.transAxes)
    fig.suptitle(f"Ring all-reduce in {plural(n, 'rank')}: rank r sends to rank (r+1) % {n}; thick outline = sent next",
                 fontsize=12)
    return fig


def draw_barrier(arrivals: Sequence[float]) -> Picture:
    """Ranks reach a barrier at different times (seconds) and all leave when the last arrives (notebook 04)."""
    n = len(arrivals)
    release = max(arrivals)
    fig = Picture(figsize=(7, 0.45 * n + 1.2), layout="constrained")
    ax = fig.subplots()
    for rank, t in enumerate(arrivals):
        y = n - 1 - rank
        ax.barh(y, t, color=PALETTE[rank % len(PALETTE)], height=0.6)
        if release > t:
            ax.barh(y, release - t, left=t, color="white", edgecolor="#999999", hatch="//", height=0.6)
        ax.text(-0.02 * release, y, f"rank {rank}", ha="right", va="center", fontsize=10)
    ax.axvline(release, color="black", linestyle="--")
    ax.text(release, n - 0.35, " barrier: everyone leaves", va="bottom", fontsize=9)
    ax.set_yticks([])
    ax.set_xlim(0, release * 1.35)
    ax.set_ylim(-0.6, n + 0.2)
    ax.set_xlabel("time (s): coloured = working, hatched = waiting at the barrier")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return fig
