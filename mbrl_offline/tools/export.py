"""Export a trained policy: `mbrl-export checkpoint=runs/ravl-hopper-seed0/checkpoint.pt [format=onnx]`.

Writes the checkpoint's deterministic policy (the action evaluation takes, in the env's units) as a file
that needs only torch (``format=torchscript``, the default: ``policy.pt`` beside the checkpoint) or only
onnxruntime (``format=onnx``: ``policy.onnx``; exporting needs ``pip install 'mbrl_offline[export]'``) to
act; ``out=`` names another file, and an existing one is refused unless ``overwrite=true``. A
feed-forward policy maps observations ``(B, obs_dim)`` to actions; NEUBAY's recurrent one takes one step,
its state in and out (`mbrl_offline.export`). Every setting is checked before the checkpoint is read
(mbrl_offline/configs/export.yaml). ``--help`` lists them; ``--cfg job`` prints the composed config and
writes nothing.
"""
from pathlib import Path

from mbrl_offline.cli import cli_main, tool_config
from mbrl_offline.config import CONFIG_DIR


def check(cfg) -> Path:
    """The settings, before the checkpoint is read; returns the file to write."""
    from mbrl_offline.config import check_writable_dir
    from mbrl_offline.errors import ConfigError
    from mbrl_offline.export import FORMATS, check_format

    if not cfg.checkpoint:
        raise ConfigError("give the checkpoint to export: checkpoint=runs/<run>/checkpoint.pt")
    check_format(cfg.format)
    if not Path(cfg.checkpoint).is_file():
        raise ConfigError(f"checkpoint={cfg.checkpoint}: no such file; give a run's checkpoint.pt.")
    out = Path(cfg.out) if cfg.out else Path(cfg.checkpoint).parent / f"policy{FORMATS[cfg.format]}"
    if out.is_dir():
        raise ConfigError(f"out={out} is a folder; give a file name, e.g. out={out / ('policy' + FORMATS[cfg.format])}.")
    if out.exists() and not cfg.overwrite:
        raise ConfigError(f"{out} already exists; pass overwrite=true to replace it, or choose another out=.")
    check_writable_dir(out.parent, "out")
    return out


@cli_main
def main(argv: list[str]) -> None:
    from mbrl_offline.export import export_policy

    cfg = tool_config(argv, __doc__, CONFIG_DIR, "export")
    out = check(cfg)
    export_policy(cfg.checkpoint, out, cfg.format)
    if cfg.format == "torchscript":
        print(f"wrote {out}; act with torch alone:\n  policy = torch.jit.load({str(out)!r})\n"
              f"  actions = policy(torch.as_tensor(observations, dtype=torch.float32))")
    else:
        print(f"wrote {out}; act with onnxruntime alone:\n  session = onnxruntime.InferenceSession({str(out)!r})\n"
              f"  actions = session.run(None, {{'observations': observations.astype('float32')}})[0]")


if __name__ == "__main__":
    main()
