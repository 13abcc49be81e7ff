"""Tests for scripts/benchmark.py: the optimization ladder."""

from pathlib import Path

import pytest

from helpers import load_script


def test_each_row_adds_its_change_to_the_previous_rows():
    benchmark = load_script("benchmark")
    rows = benchmark.ladder("/images", Path("/cache"), "cpu", gpus=0, bf16=True)
    assert [row.name for row in rows] == benchmark.ROWS
    seen = benchmark.row_overrides(["model=cnn", "data.batch_size=8", "precision=fp16"], rows)
    assert seen["baseline"][:2] == ["model=cnn", "data.batch_size=8"] and "precision=fp16" not in seen["baseline"]
    assert "data.num_workers=auto" in seen["workers"] and "precision=fp32" in seen["workers"]
    assert "data=cached" in seen["cached"] and "data.root=/cache" in seen["cached"]
    assert not any(o.startswith(("data.num_workers", "data.pin_memory")) for o in seen["cached"])  # not data=cached's
    assert {"precision=bf16", "trainer.channels_last=true", "trainer.compile=true"} <= set(seen["compile"])
    assert "model=cnn" in seen["compile"] and "data.batch_size=8" in seen["compile"]
    assert rows[-1].skip.startswith("on cpu: DDP over all local GPUs needs CUDA")
    one_gpu = benchmark.ladder("/images", Path("/cache"), "cuda", gpus=1, bf16=False)
    assert one_gpu[-1].skip == "1 CUDA device: DDP needs 2 or more"
    assert one_gpu[3].overrides == ["precision=fp16"] and "GradScaler" in one_gpu[3].change
    assert benchmark.ladder("/images", Path("/cache"), "cuda", gpus=2, bf16=True)[-1].skip is None


@pytest.mark.slow  # two train.py subprocess runs and the cache between them: 11 to 18 s here
def test_the_ladder_writes_a_table_and_a_chart_with_skipped_rows_and_their_reasons(tmp_path, capsys):
    benchmark = load_script("benchmark")
    args = ["--out", str(tmp_path), "--rows", "baseline,cached,ddp", "--steps", "2", "--images", "120"]
    assert benchmark.main([*args, "model.widths=[4,8]", "data.image_size=8", "data.batch_size=8"]) == 0
    printed = capsys.readouterr().out
    table = printed[printed.index("| row |") :].strip()
    lines = table.splitlines()
    assert len(lines) == 5 and "speed-up vs baseline" in lines[0]
    baseline, cached, ddp = (line.split(" | ") for line in lines[2:])
    assert baseline[0] == "| baseline" and baseline[-1] == "1.00x |" and "GiB (RSS)" in baseline[5]
    assert cached[0] == "| cached" and float(cached[2].replace(",", "")) > 0 and cached[-1].endswith("x |")
    assert ddp[0] == "| ddp" and "skipped: on cpu: DDP over all local GPUs needs CUDA" in ddp[2]
    assert (tmp_path / "benchmark.md").read_text().strip().endswith(table)
    assert (tmp_path / "benchmark.png").stat().st_size > 0
    assert (tmp_path / "runs" / "cached" / "metrics.jsonl").exists()


def test_speed_ups_are_over_the_first_measured_row_and_a_failed_run_says_why():
    benchmark = load_script("benchmark")
    measured = {"train/step_ms": 10.0, "train/data_wait_fraction": 0.25, "peak memory": "1.00 GiB (GPU)"}
    rows = [
        benchmark.Row("workers", "+ workers", [], result={"failed": "exit 1: error: data.root: ..."}),
        benchmark.Row("cached", "+ cache", [], result=measured | {"train/samples_per_sec": 100.0}),
        benchmark.Row("amp", "+ bf16", [], result=measured | {"train/samples_per_sec": 250.0}),
    ]
    lines = benchmark.table(rows).splitlines()
    assert "speed-up vs cached" in lines[0]
    assert lines[2].startswith("| workers | + workers | failed: exit 1: error: data.root: ... |")
    assert lines[3] == "| cached | + cache | 100 | 10.0 | 25% | 1.00 GiB (GPU) | 1.00x |"
    assert lines[4].endswith("| 2.50x |")


def test_a_workload_that_is_not_an_image_folder_is_refused_in_one_line(tmp_path, capsys):
    benchmark = load_script("benchmark")
    assert benchmark.main(["--out", str(tmp_path), "data=digits"]) == 1
    assert capsys.readouterr().err.startswith("error: data: data=digits, but the ladder trains an image folder")
    assert not (tmp_path / "images").exists()  # refused before any PNG is written
