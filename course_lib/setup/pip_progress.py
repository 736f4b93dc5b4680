"""pip's progress in a few lines (the README's set-up, before notebook 00): what it is doing at least every few
seconds, instead of pip's hundreds of lines or, with -q, nothing for minutes. Standard library only.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

PIP_HEARTBEAT = 10.0  # seconds: the most the install stays silent


def pip_with_progress(command: list[str], heartbeat: float = PIP_HEARTBEAT) -> int:
    """Run pip, showing its progress in a few lines instead of pip's hundreds (or, with -q, nothing for minutes).

    Each package pip starts on is counted; a line says what it is doing at least every `heartbeat` seconds
    ("[course] pip: 23 packages so far, now torchvision (1 min 5 s)"), and when it installs and has installed.
    pip's warnings and errors (its stderr) are shown as pip prints them.
    """
    import threading
    import time

    started, state = time.monotonic(), {"said": time.monotonic(), "packages": 0, "now": "resolving", "lines": []}
    lock, done = threading.Lock(), threading.Event()

    def elapsed() -> str:
        seconds = round(time.monotonic() - started)
        return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"

    def tell(message: str) -> None:
        with lock:
            state["said"] = time.monotonic()
        print(f"[course] pip: {message} ({elapsed()})", flush=True)

    def heartbeat_loop() -> None:
        while not done.wait(1.0):
            if time.monotonic() - state["said"] >= heartbeat:
                tell(f"{state['packages']} packages so far, now {state['now']}")

    def stop(signum, frame):  # SIGTERM or SIGHUP here: pip stops too (Ctrl-C reaches it from the terminal anyway)
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGHUP)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, errors="replace")
    thread = threading.Thread(target=heartbeat_loop, daemon=True)
    thread.start()
    try:
        for line in process.stdout:
            state["lines"] = (state["lines"] + [line.rstrip()])[-40:]
            found = re.match(r"(Collecting|Requirement already satisfied:|Obtaining|Processing) +(\S+)", line)
            if found:  # a name (torch==2.14.1, numpy), or a path or URL (the course itself: its last part)
                state["packages"] += 1
                last = found.group(2).rstrip("/").rsplit("/", 1)[-1]  # torch==2.14.1, or torch-2.14.1-cp311-...whl
                state["now"] = re.split(r"[=<>!~\[;]", last.split("-")[0] if last.endswith(".whl") else last)[0]
            elif line.startswith("Installing collected packages:"):
                names = line.split(":", 1)[1].split(",")
                state["now"] = f"installing {len(names)} packages"
                tell(f"{state['packages']} packages resolved; installing {len(names)} of them")
            elif line.startswith("Successfully installed"):
                tell(f"installed {len(line.split()) - 2} packages")
        returncode = process.wait()
    finally:
        done.set()
        if process.poll() is None:
            process.kill()
            process.wait()
        for number, handler in previous.items():
            signal.signal(number, handler)
    if returncode != 0 and state["lines"]:  # what pip printed last, for the message below
        print("\n".join(state["lines"][-15:]), file=sys.stderr)
    return returncode
