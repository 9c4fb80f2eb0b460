"""goodput plan run: one Markdown report with its plots, from the example configuration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from goodput.cli.main import app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3-405b.yaml"
runner = CliRunner()


def test_report_from_example(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    shutil.copy(EXAMPLE, cfg)
    r = runner.invoke(app, ["plan", "run", str(cfg), "--out", str(tmp_path / "out"), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    md = (tmp_path / "out" / "report.md").read_text()
    for section in (
        "## Failures",
        "## Checkpoint size and write",
        "## Interval",
        "## Token stream",
        "## Interconnect",
        "## Activation memory",
        "## Spot",
    ):
        assert section in md
    assert "5.670 TB" in md and "3.09 h" in md  # 405e9 x 14 B; Llama 3's MTBI
    for png in ("interval.png", "spot.png"):
        assert (tmp_path / "out" / png).read_bytes()[:4] == b"\x89PNG" and f"]({png})" in md
    assert data["size"]["total_bytes"] == 405e9 * 14
    # async: the stall is the staging copy (346 MB at 50 GB/s), the interval is floored at the write time
    assert abs(data["stall_s"] - 346.1e6 / 50e9) < 1e-4 and data["interval_s"] >= data["write_s"]


def test_bad_config_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model: {params: 405e9}\ncluster: {gpus: 100, tp: 8, pp: 16}\nstorage: {write_bandwidth: 100GB/s}\n")
    r = runner.invoke(app, ["plan", "run", str(cfg)])
    assert r.exit_code == 2 and "multiple of tp" in r.output
    cfg.write_text("model: {}\n")
    r = runner.invoke(app, ["plan", "run", str(cfg)])
    assert r.exit_code == 2 and "model.params" in r.output
