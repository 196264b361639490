"""The HTML report: built from real records (a real tuning run and recorded PoCL
measurements), checked value by value, and rendered in headless Chromium."""

from __future__ import annotations

import argparse
import html
import json
import re
from pathlib import Path

import numpy as np
import pytest

import autosched
from autosched.cli import report_cmd
from autosched.cost_model import feature_names
from autosched.errors import InvalidInputError
from autosched.measure.runner import TimingOptions
from autosched.ops import workload_from_json
from autosched.records.files import import_jsonl
from autosched.records.record import STATUSES, Record
from autosched.records.sqlite import SQLiteDatabase
from autosched.report import (
    build_report,
    collect,
    device_limits,
    knob_importance,
    measure_numpy,
    write_report,
)
from autosched.report.markup import fmt_gflops
from autosched.space.config import Config
from autosched.space.select import make_space
from tests.browser import chart_blue, screenshot

DATA = Path(__file__).parent / "data" / "matmul_pocl_records.jsonl"
WORKLOAD = autosched.workload("matmul", M=64, N=64, K=64)
SECTION_PARTS = ("header", "progress", "compare", "top", "errors", "importance", "noise")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A records database holding one real tuning run plus the recorded PoCL measurements."""
    db = tmp_path_factory.mktemp("report") / "r.db"
    result = autosched.tune(
        WORKLOAD,
        trials=8,
        batch=4,
        strategy="random",
        db=db,
        timing=TimingOptions(min_time_s=0.01),
    )
    with SQLiteDatabase(db) as store:
        imported = import_jsonl(store, DATA)
    assert imported.added > 800 and not imported.errors
    return db, result


@pytest.fixture(scope="module")
def page(tuned) -> str:
    db, _ = tuned
    return build_report(db, vendor_gflops=123.45)


def _keys(records) -> set[str]:
    return {r.config_key for r in records}


def _sections(page: str) -> dict[str, str]:
    """Section HTML by workload key."""
    chunks = re.split(r'(?=<section class="workload" id="s\d+">)', page)[1:]
    out = {}
    for chunk in chunks:
        key = re.search(r"matmul-[0-9a-f]{16}", chunk)
        assert key is not None
        out[key.group(0)] = chunk
    return out


def _records(db: Path, workload_key: str) -> list[Record]:
    with SQLiteDatabase(db, create=False) as store:
        return store.query(workload_key=workload_key)


def test_every_section_has_every_part(tuned, page):
    db, _ = tuned
    sections = _sections(page)
    with SQLiteDatabase(db, create=False) as store:
        keys = {(r.workload_key, r.device_key, r.target) for r in store.query()}
    assert len(sections) == len(keys) == 6  # the tuned shape and the 5 recorded ones
    for chunk in sections.values():
        anchor = re.search(r'id="(s\d+)"', chunk).group(1)
        for part in SECTION_PARTS:
            assert f'id="{anchor}-{part}"' in chunk, part
        assert chunk.count("<svg") >= 4  # 2 progress charts, comparison, importance
    # Self-contained: no scripts, nothing fetched (namespace URIs are names, not fetches).
    for fetch in ("<script", "<link", "<img", "<iframe", "@import", 'src="', 'href="http'):
        assert fetch not in page, fetch
    assert not re.search(r"url\((?!#)", page)  # only references inside the page


def test_header_and_best_are_the_databases_values(tuned, page):
    db, result = tuned
    chunk = _sections(page)[WORKLOAD.key]
    with SQLiteDatabase(db, create=False) as store:
        best = store.best(WORKLOAD.key, device_key=result.best.device_key, target="opencl")[0]
    records = _records(db, WORKLOAD.key)
    device = records[0].device
    assert "M=64, N=64, K=64" in chunk and "<dt>options</dt><dd>epilogue=none</dd>" in chunk
    assert device["name"] in chunk and device["driver_version"] in chunk
    assert (
        f"{len({r.config_key for r in records})} configs measured ({len(records)} records" in chunk
    )
    assert result.run_id in chunk
    assert fmt_gflops(best.gflops) in chunk
    # The top table's first row is that best record.
    top = chunk[chunk.index("-top") :]
    first_row = re.search(
        r"<tbody><tr[^>]*><td>1(?:<span[^>]*>default</span>)?</td>(.*?)</tr>", top
    )
    assert first_row is not None and fmt_gflops(best.gflops) in first_row.group(1)


def test_error_counts_match_the_records(tuned, page):
    db, _ = tuned
    for key, chunk in _sections(page).items():
        records = _records(db, key)
        errors = chunk[chunk.index("-errors") : chunk.index("-importance")]
        for status in STATUSES[1:]:
            m = re.search(
                rf'<code>{status}</code></td><td class="num">(?:<span class="zero">)?(\d+)', errors
            )
            assert m is not None, status
            expected = sum(r.status == status for r in records)
            assert int(m.group(1)) == expected, (key, status)
            if expected:  # with the first message of its kind
                first = next(r for r in records if r.status == status)
                assert html.escape(first.error.splitlines()[0][:60]) in errors
    # The recorded data holds invalid configs: the report must show them, not only zeros.
    assert any(
        '<code>invalid</code></td><td class="num">1<' in chunk for chunk in _sections(page).values()
    )


def test_default_tuned_and_vendor_are_compared(tuned, page):
    db, result = tuned
    chunk = _sections(page)[WORKLOAD.key]
    compare = chunk[chunk.index("-compare") : chunk.index("-top")]
    records = _records(db, WORKLOAD.key)
    limits = device_limits(records[0].device, "opencl")
    default_key = make_space(WORKLOAD, limits=limits).default().key
    default_first = next(r for r in records if r.config_key == default_key)
    assert fmt_gflops(default_first.gflops) in compare
    assert fmt_gflops(result.default.gflops) in compare  # re-measured side by side
    assert "123.45" in compare and "vendor (given)" in compare
    assert "side by side" in compare


def test_finalists_are_compared_with_their_search_measurement(tuned, page):
    db, result = tuned
    chunk = _sections(page)[WORKLOAD.key]
    noise = chunk[chunk.index("-noise") :]
    records = [r for r in _records(db, WORKLOAD.key) if r.run_id == result.run_id]
    # The tuner adds the re-measured finalists last, each a config measured before (a
    # batch's control, measured again mid-batch, is not one of them).
    assert len({r.config_key for r in records}) == 8
    last_new = max(i for i, r in enumerate(records) if r.config_key not in _keys(records[:i]))
    finals = records[last_new + 1 :]
    assert finals and len(records) > 8 + len(finals)  # the batches' controls
    assert [r for r in records if r.rounds] == finals  # as their records say
    # The round's leader, what compilers take, is marked (once).
    assert noise.count("compilers take") == 1 and result.best.rounds == 3
    assert f"Run <code>{result.run_id}</code>" in noise
    for r in finals:
        assert fmt_gflops(r.gflops) in noise
        first = next(s for s in records if s.config_key == r.config_key)
        assert fmt_gflops(first.gflops) in noise
    assert "Kendall" in noise or len(finals) < 3
    # Records without a final round say so.
    recorded = _sections(page)[next(k for k in _sections(page) if k != WORKLOAD.key)]
    assert "No finalists were re-measured" in recorded


def test_knob_importance_from_the_recorded_family(tuned, page):
    db, _ = tuned
    with DATA.open() as f:
        recorded = [Record.from_json(json.loads(line)) for line in f if line.strip()]
    chunk = _sections(page)[recorded[0].workload_key]
    part = chunk[chunk.index("-importance") : chunk.index("-noise")]
    assert "XGBoost built-in total gain" in part
    with SQLiteDatabase(db, create=False) as store:
        family = store.query(op="matmul", device_family=recorded[0].device_family, target="opencl")
    imp = knob_importance(family)
    # Training rows are the records whose config is valid in today's space (the space
    # has tightened since some of these were recorded: the unrolled-body cap).
    valid = [
        r
        for r in family
        if make_space(
            workload_from_json(r.workload), limits=device_limits(r.device, "opencl")
        ).is_valid(Config.from_json(r.config))
    ]
    assert 0.9 * len(family) < len(valid) <= len(family)
    assert imp.n_records == len(valid) and imp.n_workloads >= 5
    assert len(imp.features) == 10
    shares = [s for _, s in imp.features]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    space = make_space(
        workload_from_json(recorded[0].workload), limits=device_limits(recorded[0].device, "opencl")
    )
    assert {n for n, _ in imp.features} <= set(feature_names(space))
    for name, share in imp.features:
        assert f"<code>{name}</code>" in part and f"{100 * share:.1f}%" in part


def test_permutation_importance_for_models_without_gains():
    with DATA.open() as f:
        recorded = [Record.from_json(json.loads(line)) for line in f if line.strip()]
    imp = knob_importance(recorded, kind="hgb-reg")
    assert "permutation importance" in imp.method and "held-out 25%" in imp.method
    assert imp.features and all(s > 0 for _, s in imp.features)


def test_too_few_records_for_importance_says_so(tuned, tmp_path):
    db, result = tuned
    small = tmp_path / "small.db"
    with SQLiteDatabase(small) as store:
        store.add([r for r in _records(db, WORKLOAD.key) if r.run_id == result.run_id][:6])
    text = build_report(small, measure_vendor=True)
    assert "No importances: too few records to learn from: 6 usable" in text
    assert "numpy" in text and "BLAS" in text


def test_numpy_vendor_figure():
    figure = measure_numpy(WORKLOAD.to_json(), min_time_s=0.05)
    assert figure.gflops > 0.1 and "numpy" in figure.source and "BLAS" in figure.source
    assert figure.label.startswith("numpy (")
    softmax = measure_numpy(autosched.workload("softmax", rows=64, cols=64).to_json(), min_time_s=0)
    assert softmax.gflops > 0 and softmax.label == "numpy" and "BLAS" not in softmax.source
    unknown = {"op": "winograd", "params": {}, "dtype": "float32"}
    with pytest.raises(InvalidInputError):
        measure_numpy(unknown)


def test_shapes_follow_the_op_and_choices_are_options():
    from autosched.report.markup import option_params, shape_params

    conv = autosched.workload(
        "conv2d", layout="NHWC", k=8, n=1, c=4, h=9, w=9, r=3, s=3, stride=2
    ).to_json()
    conv["params"] = dict(reversed(list(conv["params"].items())))  # JSON order must not matter
    assert [k for k, _ in shape_params(conv)] == [
        *("n", "c", "h", "w", "k", "r", "s", "stride", "pad", "dilation", "groups")
    ]
    assert option_params(conv) == [("layout", "NHWC")]
    chain = autosched.workload("elementwise", rows=4, cols=8, ops="add+relu").to_json()
    assert shape_params(chain) == [("rows", 4), ("cols", 8)]
    assert option_params(chain) == [("ops", "add+relu")]
    assert shape_params(WORKLOAD.to_json()) == [("M", 64), ("N", 64), ("K", 64)]
    assert option_params(WORKLOAD.to_json()) == [("epilogue", "none")]


def test_report_of_convolutions_and_dense_layers_with_their_numpy_baselines(tmp_path, device):
    from tests.tuned_records import record_for

    conv = autosched.workload("conv2d", n=1, c=4, h=9, w=9, k=8, r=3, s=3, stride=2, layout="NHWC")
    dense = autosched.workload("dense", m=16, n=32, k=24, epilogue="bias_gelu")
    rng = np.random.default_rng(0)
    records = []
    for wl in (conv, dense):
        space = make_space(wl, limits=device.limits)
        configs = [space.default(), *space.sample(rng, 4)]
        records += [
            record_for(wl, device, c, latency_s=1e-4 * (i + 1)) for i, c in enumerate(configs)
        ]
    db = tmp_path / "ops.db"
    with SQLiteDatabase(db) as store:
        store.add(records)
    page = build_report(db, measure_vendor=True)
    chunks = re.split(r'(?=<section class="workload" id="s\d+">)', page)[1:]
    assert len(chunks) == 2
    by_op = {re.search(r"<h2>(\w+) ", c).group(1): html.unescape(c) for c in chunks}
    conv_text, dense_text = by_op["conv2d"], by_op["dense"]
    assert (
        "conv2d n=1, c=4, h=9, w=9, k=8, r=3, s=3, stride=2, pad=0, dilation=1, groups=1 "
        "(layout=NHWC) on " in conv_text
    )
    assert "<dt>options</dt><dd>layout=NHWC</dd>" in conv_text
    assert "dense m=16, n=32, k=24 (epilogue=bias_gelu) on " in dense_text
    assert "<dt>options</dt><dd>epilogue=bias_gelu</dd>" in dense_text
    for text, method in ((conv_text, "im2col"), (dense_text, "x @ W.T")):
        assert "numpy (" in text and method in text and "BLAS" in text


def test_filters_and_bad_input(tuned, tmp_path):
    db, result = tuned
    only = collect(db, device_key=result.best.device_key, target="opencl")
    assert {s.device_key for s in only} == {result.best.device_key}
    with pytest.raises(
        InvalidInputError, match="no records in .* match op 'conv2d'; it holds ops: matmul"
    ):
        build_report(db, op="conv2d")
    with pytest.raises(InvalidInputError, match="match target 'llvm'"):
        build_report(db, target="llvm")
    missing = tmp_path / "missing.db"
    with pytest.raises(InvalidInputError, match="does not exist"):
        build_report(missing)
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    SQLiteDatabase(empty).close()
    with pytest.raises(InvalidInputError, match="holds no records"):
        build_report(empty)
    for bad in (0, -1.0, float("nan"), "fast"):
        with pytest.raises(InvalidInputError, match="vendor_gflops"):
            build_report(db, vendor_gflops=bad)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    report_cmd.add_parser(parser.add_subparsers())
    return parser.parse_args(["report", *argv])


def test_cli_writes_the_report(tuned, tmp_path, capsys):
    db, _ = tuned
    out = tmp_path / "sub" / "report.html"
    args = _parse(["--db", str(db), "--op", "matmul", "--vendor-gflops", "7.5", "-o", str(out)])
    assert args.func(args) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "7.50" in text
    assert str(out) in capsys.readouterr().err
    with pytest.raises(InvalidInputError, match="does not exist"):
        report_cmd.run(_parse(["--db", str(tmp_path / "nope.db"), "-o", str(out)]))
    assert not (tmp_path / "nope.db").exists()


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    from autosched.cli import main

    status = main(["report", "--db", str(tmp_path / "nope.db"), "-o", str(tmp_path / "r.html")])
    assert status == 2 and not (tmp_path / "nope.db").exists()


# -- rendering ---------------------------------------------------------------------------
def test_report_renders_in_headless_chromium(tuned, tmp_path):
    db, _ = tuned
    page_file = write_report(db, tmp_path / "report.html", vendor_gflops=50.0)
    image = screenshot(page_file, tmp_path / "shot.png")
    assert float(image.std()) > 0.05  # not blank
    ink = np.any(image < 0.9, axis=-1).mean()
    assert 0.03 < ink < 0.7, ink  # text and charts, not a blank or solid page
    # The charts drew: the runs' blue lines and markers are there.
    blue = chart_blue(image)
    assert blue > 500, blue


def test_two_cpus_of_one_name_get_sections_told_apart(tmp_path):
    """A cloud VM names a Zen 4 and a Zen 5 both "AMD EPYC": their sections' titles
    name each CPU's model (the llvm softmax samples of bench/replay, 40 records each)."""
    from autosched.tuning.replay import read_records

    replay = Path(__file__).parent.parent / "bench" / "replay"
    db = tmp_path / "r.db"
    with SQLiteDatabase(db) as store:
        for tag in ("zen4", "zen5"):
            store.add(read_records(replay / f"softmax-1536x128-llvm-{tag}.jsonl.gz")[:40])
    titles = re.findall(r"<h2>([^<]*)</h2>", build_report(db, vendor_gflops=1.0))
    assert sorted(titles) == [
        f"softmax rows=1536, cols=128 on AMD EPYC (family {m}) (llvm)"
        for m in ("25 model 17", "26 model 2")
    ]
