"""The command line's operator surface: ``--shape`` parsing for every op, ``--epilogue``,
``autosched ops``, and one-line errors with exit status 2. Nothing here tunes."""

from __future__ import annotations

import json
import shlex

import pytest

from autosched.cli import build_parser, main
from autosched.cli.shared import workload_from_args
from autosched.errors import InvalidInputError
from autosched.ops import OPS, workload
from autosched.ops.shape import parse_shape


def _args(*argv: str):
    return build_parser().parse_args(["tune", *argv])


def _error_line(capsys, *argv: str) -> str:
    """Run a command that must fail on its input; return its single stderr line."""
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert captured.out == ""
    return lines[0]


# -- parse_shape ------------------------------------------------------------------------
@pytest.mark.parametrize("op", list(OPS))
def test_every_example_parses_to_its_workload(op):
    params = parse_shape(op, OPS[op].example)
    wl = workload(op, **params)
    assert wl.op == op and set(wl.params) == set(OPS[op].shape_params)


def test_named_parameters_with_values_of_the_right_type():
    assert parse_shape(
        "conv2d", "n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=2,pad=1,dilation=2,groups=4,layout=NHWC"
    ) == dict(
        n=1, c=64, h=56, w=56, k=64, r=3, s=3, stride=2, pad=1, dilation=2, groups=4, layout="NHWC"
    )
    assert parse_shape("dense", " m=128 , n=3072,k=768, epilogue=bias_gelu ") == dict(
        m=128, n=3072, k=768, epilogue="bias_gelu"
    )
    assert parse_shape("reduce", "rows=2048,cols=49,kind=max") == dict(
        rows=2048, cols=49, kind="max"
    )
    assert parse_shape("elementwise", "rows=4,cols=8,ops=add+relu") == dict(
        rows=4, cols=8, ops="add+relu"
    )
    # pad=0 is a valid value: the op, not the parser, checks ranges.
    assert parse_shape("depthwise_conv2d", "n=1,c=8,h=9,w=9,r=3,s=3,pad=0")["pad"] == 0


@pytest.mark.parametrize(
    "op, text, expected",
    [
        ("matmul", "8,16,32", dict(M=8, N=16, K=32)),
        ("matmul", "m=8,n=16,k=32", dict(M=8, N=16, K=32)),
        ("matmul", "M=8,n=16,K=32", dict(M=8, N=16, K=32)),
        ("batch_matmul", "12,128,128,64", dict(b=12, m=128, n=128, k=64)),
        ("softmax", "1536,128", dict(rows=1536, cols=128)),
        ("layernorm", "128,768", dict(rows=128, cols=768)),
        ("layernorm", "ROWS=128,Cols=768", dict(rows=128, cols=768)),
    ],
)
def test_positional_and_case_insensitive_names(op, text, expected):
    assert parse_shape(op, text) == expected


def test_defaults_may_be_left_out():
    short = workload_from_args(_args("--op", "conv2d", "--shape", "n=1,c=8,h=9,w=9,k=8,r=3,s=3"))
    full = workload_from_args(
        _args(
            "--op",
            "conv2d",
            "--shape",
            "n=1,c=8,h=9,w=9,k=8,r=3,s=3,stride=1,pad=0,dilation=1,groups=1,layout=NCHW",
        )
    )
    assert short.key == full.key


CONV_ACCEPTED = (
    "accepted: n, c, h, w, k, r, s, stride=1, pad=0, dilation=1, groups=1, layout=NCHW (NCHW|NHWC)"
)


@pytest.mark.parametrize(
    "op, text, fragments",
    [
        ("conv2d", "n=1,c=8,h=9,w=9,k=8,r=3,s=3,padding=1", ["unknown parameter 'padding'"]),
        ("conv2d", "n=1,c=8,h=9,w=9", ["lacks k, r, s"]),
        ("conv2d", "n=1,c=8,h=9,w=9,k=8,r=3,s=3,n=2", ["n is given twice"]),
        ("conv2d", "n=1,c=8,h=9,w=9,k=8,r=3,s=3,stride=two", ["stride='two' is not an integer"]),
        ("conv2d", "n=1,c=8,h=9,w=9,k=8,r=3,s=3,pad=1.5", ["pad='1.5' is not an integer"]),
        ("conv2d", "1,8,9,9,8,3,3", ["conv2d takes name=value parameters"]),
        ("conv2d", "n=1,8,9,9,8,3,3", ["is malformed"]),
        ("conv2d", "", ["is malformed"]),
    ],
)
def test_wrong_or_missing_parameters_list_the_accepted_ones(capsys, op, text, fragments):
    line = _error_line(capsys, "tune", "--op", op, "--shape", text)
    assert line.startswith("autosched: error: ")
    for fragment in [*fragments, CONV_ACCEPTED, "e.g. --shape n=1,c=64,h=56"]:
        assert fragment in line


@pytest.mark.parametrize(
    "op, text, fragment",
    [
        ("matmul", "8,8", "is malformed for matmul; accepted: M, N, K, epilogue=none"),
        ("matmul", "M=8,m=8,K=8", "M is given twice"),
        ("matmul", "M=8,N=8,K=8,B=2", "or M,N,K by position"),
        ("batch_matmul", "2,3,4", "accepted: b, m, n, k, or b,m,n,k by position"),
        ("dense", "128,3072,768", "dense takes name=value parameters; accepted: m, n, k,"),
        ("dense", "m=1,n=2,k=3,epilogue=gelu", "accepted: none, bias, bias_relu, bias_gelu"),
        ("depthwise_conv2d", "n=1,c=8,h=9,w=9,r=3,s=3,dilation=2", "unknown parameter"),
        ("depthwise_conv2d", "n=1,c=8,h=9,w=9,r=3,s=3,layout=HWC", "accepted: NCHW, NHWC"),
        ("conv2d", "n=1,c=8,h=9,w=9,k=8,r=3,s=3,groups=3", "c=8 is not divisible by groups=3"),
        (
            "conv2d",
            "n=1,c=8,h=9,w=9,k=8,r=3,s=3,pad=-1",
            "pad=-1 is negative; accepted: an integer >= 0",
        ),
        (
            "softmax",
            "rows=0,cols=8",
            "softmax rows=0 is not positive; accepted: a positive integer",
        ),
        ("layernorm", "128", "accepted: rows, cols, or rows,cols by position"),
        ("reduce", "rows=4,cols=8", "lacks kind; accepted: rows, cols, kind (sum|max)"),
        ("reduce", "rows=4,cols=8,kind=mean", "accepted: sum, max"),
        ("elementwise", "rows=4,cols=8", "ops (add|mul|relu|gelu joined by +)"),
        ("elementwise", "rows=4,cols=8,ops=add+tanh", "'tanh' is not an operation"),
        ("matmul", "8,-8,8", "matmul N=-8 is not positive"),
        ("conv9", "1,2,3", "unknown op 'conv9'; accepted: matmul, batch_matmul, dense,"),
    ],
)
def test_bad_shapes_are_one_line_and_status_2(capsys, op, text, fragment):
    line = _error_line(capsys, "tune", "--op", op, "--shape", text)
    assert fragment in line
    with pytest.raises(InvalidInputError, match="accepted"):
        workload_from_args(_args("--op", op, "--shape", text))


def test_error_lines_list_every_ops_parameter_names():
    for op, cls in OPS.items():
        with pytest.raises(InvalidInputError) as info:
            parse_shape(op, "nonsense=1")
        for name in cls.shape_params:
            assert name in str(info.value)


# -- --epilogue -------------------------------------------------------------------------
def test_epilogue_flag_for_matmul_and_dense():
    matmul = workload_from_args(
        _args("--op", "matmul", "--shape", "8,8,8", "--epilogue", "bias_relu")
    )
    assert matmul.params["epilogue"] == "bias_relu"
    assert (
        workload_from_args(_args("--op", "matmul", "--shape", "8,8,8")).params["epilogue"] == "none"
    )
    flag = workload_from_args(
        _args("--op", "dense", "--shape", "m=2,n=3,k=4", "--epilogue", "bias_gelu")
    )
    inline = workload_from_args(_args("--op", "dense", "--shape", "m=2,n=3,k=4,epilogue=bias_gelu"))
    both = workload_from_args(
        _args(
            "--op", "dense", "--shape", "m=2,n=3,k=4,epilogue=bias_gelu", "--epilogue", "bias_gelu"
        )
    )
    assert flag == inline == both and flag.params["epilogue"] == "bias_gelu"
    # "--epilogue none" is harmless for an op without epilogues (scripts pass it for all ops).
    softmax = workload_from_args(_args("--op", "softmax", "--shape", "4,8", "--epilogue", "none"))
    assert softmax == workload("softmax", rows=4, cols=8)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--op", "softmax", "--shape", "4,8", "--epilogue", "bias"], "does not apply to softmax"),
        (
            ["--op", "dense", "--shape", "m=2,n=3,k=4,epilogue=bias", "--epilogue", "bias_relu"],
            "--epilogue bias_relu contradicts epilogue=bias in --shape",
        ),
        (["--op", "matmul", "--shape", "8,8,8", "--epilogue", "gelu"], "none, bias, bias_relu"),
    ],
)
def test_bad_epilogue_is_one_line_and_status_2(capsys, argv, fragment):
    assert fragment in _error_line(capsys, "tune", *argv)


# -- autosched ops ----------------------------------------------------------------------
def test_ops_lists_every_operator_with_parameters_choices_and_an_example(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    for op, cls in OPS.items():
        assert f"autosched tune --op {op} --shape {cls.example}" in out
        assert cls.summary in out
    assert "n, c, h, w, k, r, s, stride=1, pad=0, dilation=1, groups=1, layout=NCHW" in out
    assert "none, bias, bias_relu, bias_gelu" in out
    assert "add, mul, relu, gelu; a chain joined by +" in out
    assert "(or by position: M,N,K)" in out


def test_ops_json_and_its_examples_work(capsys):
    assert main(["ops", "--json"]) == 0
    catalogue = json.loads(capsys.readouterr().out)
    assert [entry["op"] for entry in catalogue] == list(OPS)
    for entry in catalogue:
        cls = OPS[entry["op"]]
        assert entry["parameters"] == list(cls.shape_params)
        assert entry["defaults"] == cls.defaults
        assert entry["required"] == [n for n in cls.shape_params if n not in cls.defaults]
        assert entry["choices"] == {k: list(v) for k, v in cls.choices.items()}
        argv = shlex.split(entry["example"])
        assert argv[:2] == ["autosched", "tune"]
        wl = workload_from_args(_args(*argv[2:]))  # the example command's workload builds
        assert wl.op == entry["op"]
    conv = next(e for e in catalogue if e["op"] == "conv2d")
    assert conv["defaults"] == {"stride": 1, "pad": 0, "dilation": 1, "groups": 1, "layout": "NCHW"}
    assert conv["choices"] == {"layout": ["NCHW", "NHWC"]}


@pytest.mark.parametrize("command", ["tune", "best", "compile"])
def test_op_help_lists_every_operator(capsys, command):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "operator: " + ", ".join(OPS) in help_text
