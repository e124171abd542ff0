"""run_processes: one deadline for a group of processes, and nothing left running after it."""

from __future__ import annotations

import multiprocessing
import time

from niels_gpt_experiments.launch import run_processes


def test_processes_that_end_in_time_are_reported_finished() -> None:
    spawn = multiprocessing.get_context("spawn")
    procs = [spawn.Process(target=time.sleep, args=(0.0,)) for _ in range(2)]
    assert run_processes(procs, timeout_s=60.0)
    assert [proc.exitcode for proc in procs] == [0, 0]


def test_a_process_past_the_deadline_is_killed() -> None:
    spawn = multiprocessing.get_context("spawn")
    stuck = spawn.Process(target=time.sleep, args=(600.0,))
    start = time.monotonic()
    assert not run_processes([stuck], timeout_s=2.0)
    assert time.monotonic() - start < 60.0  # the deadline and the kill, not the sleep
    assert not stuck.is_alive() and stuck.exitcode is not None and stuck.exitcode < 0
