"""Pipeline parallelism: schedules simulated and drawn, bubbles by formula, a model split by hand (notebook 07).

    schedules.py   Op, simulate(kind, stages, m, ...): GPipe, 1F1B, interleaved 1F1B, zero bubble played out op by
                   op; bubble, makespan, peak_in_flight; the published formulas gpipe_bubble, interleaved_bubble and
                   as_fraction_of_total, as_ratio_to_ideal between them
    pictures.py    draw_schedule(ops), schedule_explorer(): one row per device, boxes per op; sliders that redraw it
    stages.py      stage_costs, split_by_boundaries, stage_times: layers' costs measured, a model cut into stages;
                   naive_split, NaiveSplit, timeline_of_naive_split: consecutive layers on consecutive devices, timed

Every name is imported from here: `from course_lib.parallel.pipeline import simulate`.
"""

from course_lib.parallel.pipeline.pictures import COLOURS, draw_schedule, schedule_explorer
from course_lib.parallel.pipeline.schedules import (KINDS, Op, as_fraction_of_total, as_ratio_to_ideal, bubble,
                                                    gpipe_bubble, interleaved_bubble, makespan, peak_in_flight,
                                                    simulate)
from course_lib.parallel.pipeline.stages import (NaiveSplit, naive_split, split_by_boundaries, stage_costs,
                                                 stage_times, timeline_of_naive_split)

__all__ = ["Op", "KINDS", "simulate", "bubble", "makespan", "peak_in_flight", "gpipe_bubble", "interleaved_bubble",
           "as_fraction_of_total", "as_ratio_to_ideal", "draw_schedule", "schedule_explorer", "stage_costs",
           "split_by_boundaries", "stage_times", "NaiveSplit", "naive_split", "timeline_of_naive_split"]
