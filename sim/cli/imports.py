"""`rlsim import verl|openrlhf|trl`: turn a run another framework logged into a step-level trace.

Thin: parse options, call `rlsim.replay.importers.import_log`, print what was imported and the next
command; an RlsimError is one line and exit code 2. Formats and caveats: docs/importing.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlsim.cli.opts import App, default_text
from rlsim.replay.errors import cli_errors
from rlsim.replay.importers import describe, import_log

_OUT = typer.Option(..., "--out", "-o", help="the step-level trace to write (.parquet)")
_CONFIG = "the run's saved config (YAML or JSON) for batch sizes, GPUs, model and caps"
_DEVICE = ("the GPU the run used (a device profile: a100-40gb, a100-80gb, h100-sxm, h200, b200, mi300x, l40s, "
           "cpu-amd-epyc); enables the roofline priors and --device rescaling")
_PARAMS = default_text("model parameters, e.g. 7B, 0.5B, 1.5e9", "read from the model path in the config")
_EVAL = default_text("the validation metric to use as the eval score", "chosen per framework, see docs/importing.md")


def _run(framework: str, log: Path, out: Path, overwrite: bool, **flags) -> None:
    path = import_log(framework, log, out=out, overwrite=overwrite, **flags)
    typer.echo(describe(path))


def register(app: typer.Typer) -> None:
    imp = App(no_args_is_help=True, add_completion=False,
                      help="Import a verl, OpenRLHF or TRL run's log as a step-level trace for `rlsim run --trace`.")
    app.add_typer(imp, name="import")

    @imp.command("verl")
    @cli_errors
    def verl_cmd(log: Path = typer.Argument(..., help="console log (step:N - key:value - ...), metrics .jsonl, or W&B history .csv"),
                 out: Path = _OUT,
                 config: Optional[Path] = typer.Option(None, "--config", "-c", help=_CONFIG + " (Hydra's .hydra/config.yaml)"),
                 prompts: Optional[int] = typer.Option(None, "--prompts", help="P: data.train_batch_size (prompts per step)"),
                 group: Optional[int] = typer.Option(None, "--group", help="G: actor_rollout_ref.rollout.n (responses per prompt)"),
                 gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs: trainer.n_gpus_per_node x trainer.nnodes"),
                 device: Optional[str] = typer.Option(None, "--device", help=_DEVICE),
                 model_params: Optional[str] = typer.Option(None, "--model-params", help=_PARAMS),
                 tp: Optional[int] = typer.Option(None, "--tp", help="rollout tensor parallel size"),
                 eval_metric: Optional[str] = typer.Option(None, "--eval-metric", help=_EVAL),
                 drop_truncated: bool = typer.Option(False, "--drop-truncated", help="skip truncated step lines instead of failing"),
                 overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out")) -> None:
        """Import a verl PPO/GRPO run."""
        _run("verl", log, out, overwrite, config=config, prompts=prompts, group=group, gpus=gpus, device=device,
             model_params=model_params, tp=tp, eval_metric=eval_metric, drop_truncated=drop_truncated)

    @imp.command("openrlhf")
    @cli_errors
    def openrlhf_cmd(log: Path = typer.Argument(..., help="W&B history export (.csv or .jsonl) with train/* and perf/experience_maker/* metrics"),
                     out: Path = _OUT,
                     config: Optional[Path] = typer.Option(None, "--config", "-c", help=_CONFIG + " (the W&B run config or the launch args as JSON/YAML)"),
                     prompts: Optional[int] = typer.Option(None, "--prompts", help="P: --rollout_batch_size (prompts per rollout)"),
                     group: Optional[int] = typer.Option(None, "--group", help="G: --n_samples_per_prompt"),
                     gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs: actor_num_nodes x actor_num_gpus_per_node"),
                     device: Optional[str] = typer.Option(None, "--device", help=_DEVICE),
                     model_params: Optional[str] = typer.Option(None, "--model-params", help=_PARAMS),
                     tp: Optional[int] = typer.Option(None, "--tp", help="--vllm_tensor_parallel_size"),
                     eval_metric: Optional[str] = typer.Option(None, "--eval-metric", help=_EVAL),
                     overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out")) -> None:
        """Import an OpenRLHF PPO/GRPO/REINFORCE++ run (Ray trainer)."""
        _run("openrlhf", log, out, overwrite, config=config, prompts=prompts, group=group, gpus=gpus, device=device,
             model_params=model_params, tp=tp, eval_metric=eval_metric)

    @imp.command("trl")
    @cli_errors
    def trl_cmd(log: Path = typer.Argument(..., help="trainer_state.json of a GRPOTrainer checkpoint (its log_history)"),
                out: Path = _OUT,
                config: Optional[Path] = typer.Option(None, "--config", "-c", help=_CONFIG + " (the GRPOConfig recipe YAML/JSON)"),
                prompts: Optional[int] = typer.Option(None, "--prompts", help="P: prompts per optimizer step"),
                group: Optional[int] = typer.Option(None, "--group", help="G: num_generations"),
                gpus: Optional[int] = typer.Option(None, "--gpus", help="training processes (GPUs)"),
                device: Optional[str] = typer.Option(None, "--device", help=_DEVICE),
                model_params: Optional[str] = typer.Option(None, "--model-params", help=_PARAMS),
                eval_metric: Optional[str] = typer.Option(None, "--eval-metric", help=_EVAL),
                overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out")) -> None:
        """Import a TRL GRPOTrainer run."""
        _run("trl", log, out, overwrite, config=config, prompts=prompts, group=group, gpus=gpus, device=device,
             model_params=model_params, eval_metric=eval_metric)
