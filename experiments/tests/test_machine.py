"""The CPU name the ablation's and the benchmarks' reports start with."""

from __future__ import annotations

import platform
from pathlib import Path

from niels_gpt_experiments.machine import cpu_name


def test_the_first_model_name_line_is_the_name(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: Example CPU @ 2.00GHz \n\n"
        "processor\t: 1\nmodel name\t: Another CPU\n"
    )
    assert cpu_name(info) == "Example CPU @ 2.00GHz"


def test_without_cpuinfo_the_platform_names_it(tmp_path: Path) -> None:
    expected = platform.processor() or platform.machine()
    assert cpu_name(tmp_path / "absent") == expected
    (tmp_path / "arm").write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # no model name line
    assert cpu_name(tmp_path / "arm") == expected
