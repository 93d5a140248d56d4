"""Tests for chexnet_utils.platform.checks: the "must be >= N" guard and the Literal
options (with the CLI's train options derived from them)."""

from __future__ import annotations

import argparse

import pytest

from chexnet_utils.platform import options as cli_options
from chexnet_utils.platform.checks import require_at_least


def test_values_at_or_above_the_minimum_pass():
    require_at_least(1, batch_size=1, num_workers=8)
    require_at_least(16, size=16)
    require_at_least(0)


def test_first_value_below_the_minimum_is_named():
    with pytest.raises(ValueError, match=r"^num_workers must be >= 1, got 0$"):
        require_at_least(1, batch_size=4, num_workers=0, image_size=-1)
    with pytest.raises(ValueError, match=r"^size must be >= 16, got 15$"):
        require_at_least(16, size=15)


# --- string options as Literal types, checked in one place; the CLI's train options from them ---

def test_literal_fields_and_their_values_come_from_the_types():
    from chexnet_utils.input.pipelines import PIPELINES
    from chexnet_utils.platform.checks import literal_choices
    from chexnet_utils.training import TrainConfig

    choices = literal_choices(TrainConfig)
    assert list(choices) == ["arch", "pipeline", "lr_scaling", "allreduce", "plateau_monitor"]
    assert choices["arch"] == ("densenet121", "resnet50", "small")
    assert choices["pipeline"] == ("new", "old") and set(PIPELINES) >= {"new", "old"}
    assert choices["allreduce"] == ("per_tensor", "grouped")


@pytest.mark.parametrize("field, bad", [("arch", "vgg16"), ("pipeline", "fast"),
                                        ("lr_scaling", "cubic"), ("allreduce", "tree"),
                                        ("plateau_monitor", "val_acc")])
def test_a_value_outside_its_literal_is_refused_by_name(field, bad):
    from chexnet_utils.training import TrainConfig

    cfg = TrainConfig(tfrecords="t", out_dir="o", **{field: bad})
    with pytest.raises(ValueError, match=rf"^{field} must be one of .*; got '{bad}'$"):
        cfg.validate_values()
    TrainConfig(tfrecords="t", out_dir="o").validate_values()  # the defaults pass


def test_train_command_options_take_type_default_and_choices_from_train_config():
    import dataclasses

    from chexnet_utils import cli
    from chexnet_utils.training import TrainConfig

    parser = cli.build_parser()
    args = parser.parse_args(["train", "--tfrecords", "t", "--out", "o", "--arch", "small",
                              "--epochs", "3"])
    cfg = TrainConfig(**{name: getattr(args, name) for name in cli.TRAIN_OPTIONS})
    defaults = TrainConfig(tfrecords="t", out_dir="o", arch="small", epochs=3)
    assert cfg == defaults  # every default equals the dataclass's, nothing copied by hand
    assert {f.name for f in dataclasses.fields(TrainConfig)} >= set(cli.TRAIN_OPTIONS)
    args = parser.parse_args(["train", "--tfrecords", "t", "--out", "o", "--arch", "resnet50",
                              "--epochs", "2", "--lr", "0.01", "--image-size", "224",
                              "--steps-per-epoch", "5", "--weights", "w.h5", "--horovod",
                              "--resume", "--pipeline", "old"])
    cfg = TrainConfig(**{name: getattr(args, name) for name in cli.TRAIN_OPTIONS})
    assert (cfg.learning_rate, cfg.image_size, cfg.steps_per_epoch, cfg.weights,
            cfg.distributed, cfg.resume, cfg.pipeline) == (0.01, 224, 5, "w.h5", True, True,
                                                           "old")
    assert isinstance(cfg.learning_rate, float) and isinstance(cfg.image_size, int)


BENCH_COMMANDS = [
    # (argv with the required options, where the function is defined, its name, options)
    (["bench", "conversion", "--data-dir", "d"], "conversion", "bench_conversion"),
    (["bench", "pipelines", "--tfrecords", "t", "--json", "j"], "pipelines", "bench_pipelines"),
    (["bench", "service"], "service", "bench_service"),
    (["bench", "link"], "link", "bench_link"),
    (["bench", "scaling"], "scaling", "bench_scaling"),
    (["bench", "gpu-node"], "gpu_node", "bench_gpu_node"),
]


@pytest.mark.parametrize(("argv", "module", "function"), BENCH_COMMANDS,
                         ids=[c[0][1] for c in BENCH_COMMANDS])
def test_bench_command_options_take_their_defaults_from_the_function(argv, module, function):
    """Every option of a bench command that has a default parses to the default of the
    benchmark function's parameter it is named after: no default copied by hand."""
    import importlib
    import inspect

    from chexnet_utils import cli
    from chexnet_utils.bench.registry import bench_commands

    bench_module = importlib.import_module(f"chexnet_utils.bench.{module}")
    fn, table = getattr(bench_module, function), bench_module.OPTIONS
    assert bench_commands()[argv[1]] is bench_module.COMMAND  # `bench <name>` is bench/<name>.py
    assert bench_module.COMMAND.function is fn and bench_module.COMMAND.options is table
    values = cli_options.option_values(cli.build_parser().parse_args(argv), table)
    params = inspect.signature(fn).parameters
    assert set(table) <= set(params)
    def plain(v: object) -> object:  # a sequence default may stay a tuple: argparse keeps it
        return list(v) if isinstance(v, tuple) else v

    for name, value in values.items():
        default = params[name].default
        if default is not inspect.Parameter.empty:
            assert plain(value) == plain(default), name


def test_a_sequence_option_is_a_comma_list():
    from collections.abc import Sequence

    from chexnet_utils.input.pipelines import Pipeline

    assert cli_options.option_type(Sequence[int])("1,2,4") == [1, 2, 4]
    assert cli_options.option_type(Sequence[str] | None)("old, new") == ["old", "new"]
    assert cli_options.option_type(Sequence[int])("") is None  # blank: the function's default
    with pytest.raises(argparse.ArgumentTypeError, match="'fast' not one of 'new', 'old'"):
        cli_options.option_type(Sequence[Pipeline])("old,fast")
    assert cli_options.shown_default((1, 2)) == "1,2" and cli_options.shown_default(1e9) == "1e+09"


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "scaling", "--pipelines", "old,fast"], "--pipelines: 'fast' not one of"),
    (["bench", "scaling", "--arch", "vgg16"], "--arch: invalid choice: 'vgg16'"),
    (["bench", "gpu-node", "--gpus", "1,x"], "--gpus: invalid"),
    (["bench", "service", "--mode", "split"], "--mode: invalid choice: 'split'"),
])
def test_bench_commands_refuse_values_their_types_would(argv, message, capsys):
    from chexnet_utils import cli

    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["bench", "scaling", "--workers", ""],
                                  ["bench", "gpu-node", "--gpus", ""],
                                  ["bench", "link", "--launchers", ""]])
def test_a_blank_list_option_means_the_default(argv):
    from chexnet_utils import cli

    args = cli.build_parser().parse_args(argv)
    from chexnet_utils.bench import gpu_node, link, scaling

    name, table = {"scaling": ("workers", scaling.OPTIONS),
                   "gpu-node": ("gpus", gpu_node.OPTIONS),
                   "link": ("launchers", link.OPTIONS)}[argv[1]]
    assert getattr(args, name) is None
    assert name not in cli_options.option_values(args, table)  # so the function's default applies


@pytest.mark.parametrize("argv", [["--arch", "vgg16"], ["--pipeline", "fast"],
                                  ["--epochs", "two"]])
def test_train_command_refuses_values_its_config_would(argv, capsys):
    from chexnet_utils import cli

    base = ["train", "--tfrecords", "t", "--out", "o", "--arch", "small", "--epochs", "1"]
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(base + argv)
    assert e.value.code == 2 and "invalid" in capsys.readouterr().err
