"""LLaMA Board (``llamafactory-cli webui``, or ``liger-lmf webui``) with a "liger_core kernels" checkbox.

LLaMA-Factory has no UI plugin API, so module attributes of its web UI are wrapped in this process only
(``import_hook`` does it when ``llamafactory.webui.interface`` is imported):
- ``webui.interface.create_top``: the top panel plus a checkbox row (element id ``top.liger_core``);
- ``webui.manager.Manager.get_base_elems``: the checkbox joins the inputs every train/eval button sends;
- ``webui.runner.Runner._parse_train_args``: ticked -> ``enable_liger_kernel: true`` in the run's YAML.
The UI starts each run as ``llamafactory-cli train <its YAML>`` in a subprocess, where the start-up hook
serves ``enable_liger_kernel`` with liger_core; the Booster choice "liger_kernel" sets the same key, so it
selects liger_core too. Only where the hook is off in that subprocess (``LIGER_CORE_DISABLE_HOOK=1`` with
``liger-lmf webui``) ``install_command_rewrite`` makes runs (and "Preview command") use ``liger-lmf train``.
"""

from __future__ import annotations

import sys

CHECKBOX_ID = "top.liger_core"
CHECKBOX_LABEL = "liger_core kernels"
CHECKBOX_INFO = (
    "Train with liger_core's Triton kernels (RMSNorm, RoPE, SwiGLU/GeGLU, fused linear cross-entropy)."
)


def _wrap_create_top(original):
    import gradio as gr

    def create_top():
        elems = original()
        with gr.Row():
            checkbox = gr.Checkbox(
                value=False, label=CHECKBOX_LABEL, info=CHECKBOX_INFO, elem_id="liger_core_box"
            )
        return {**elems, "liger_core": checkbox}

    create_top.__wrapped__ = original
    return create_top


def _wrap_get_base_elems(original):
    def get_base_elems(self):
        elems = original(self)
        checkbox = self._id_to_elem.get(CHECKBOX_ID)
        if checkbox is not None:
            elems.add(checkbox)
        return elems

    get_base_elems.__wrapped__ = original
    return get_base_elems


def _wrap_parse_train_args(original):
    def _parse_train_args(self, data):
        args = original(self, data)
        checkbox = self.manager._id_to_elem.get(CHECKBOX_ID)
        if checkbox is not None and data.get(checkbox):
            args["enable_liger_kernel"] = True
        return args

    _parse_train_args.__wrapped__ = original
    return _parse_train_args


def _wrap_popen(original):
    def Popen(cmd, *args, **kwargs):  # noqa: N802 (stands in for subprocess.Popen)
        if isinstance(cmd, list) and cmd and cmd[0] == "llamafactory-cli":
            cmd = [sys.executable, "-m", "liger_core_llamafactory", *cmd[1:]]
        return original(cmd, *args, **kwargs)

    Popen.__wrapped__ = original
    return Popen


def _wrap_gen_cmd(original):
    def gen_cmd(args):
        return original(args).replace("llamafactory-cli train", "liger-lmf train", 1)

    gen_cmd.__wrapped__ = original
    return gen_cmd


def install() -> None:
    """Wrap the web UI pieces (idempotent); call before ``create_ui()``."""
    from llamafactory.webui import interface, manager, runner

    if getattr(interface.create_top, "__wrapped__", None) is not None:
        return
    interface.create_top = _wrap_create_top(interface.create_top)
    manager.Manager.get_base_elems = _wrap_get_base_elems(manager.Manager.get_base_elems)
    runner.Runner._parse_train_args = _wrap_parse_train_args(runner.Runner._parse_train_args)


def install_command_rewrite() -> None:
    """Runs started from the UI (and their preview) use ``liger-lmf train`` (idempotent)."""
    from llamafactory.webui import runner

    if getattr(runner.Popen, "__wrapped__", None) is not None:
        return
    runner.Popen = _wrap_popen(runner.Popen)
    runner.gen_cmd = _wrap_gen_cmd(runner.gen_cmd)


def run_web_ui() -> None:
    from liger_core_llamafactory import enabled_by_environment

    install()
    if not enabled_by_environment():  # the UI's `llamafactory-cli train` runs would lack it
        install_command_rewrite()
    from llamafactory.webui.interface import run_web_ui as run

    run()
