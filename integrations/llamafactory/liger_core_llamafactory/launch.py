"""``liger-lmf train``: single process, or torchrun workers that each install the liger_core hooks.

LLaMA-Factory's launcher re-runs its own ``launcher.py`` under torchrun when several accelerators are visible
(or ``FORCE_TORCHRUN=1``); patches made in the parent would be lost there. So we make the same decision with
the same environment variables (NNODES, NODE_RANK, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT, RDZV_ID,
MIN_NNODES, MAX_NNODES, MAX_RESTARTS, OPTIM_TORCH) but start ``liger_core_llamafactory.worker`` instead, with
``LIGER_CORE_LMF=1`` in the environment when liger_core is on.
"""

from __future__ import annotations

import os
import subprocess
import sys

from liger_core_llamafactory import ENV_FLAG
from liger_core_llamafactory.options import env_enabled, pop_kernel_config, pop_liger_flag, read_train_args


def run_training(argv: list[str]) -> None:
    """Train in this process (also the body of every torchrun worker)."""
    args = read_train_args(argv)
    flagged = pop_liger_flag(args)
    enabled = flagged or env_enabled()
    kernel_config = pop_kernel_config(args)
    if enabled:
        os.environ[ENV_FLAG] = "1"  # for anything this process starts
        from liger_core_llamafactory.lmf_hooks import activate

        activate("enable_liger_kernel" if flagged else f"{ENV_FLAG}=1", kernel_config)
    else:
        import logging

        logging.getLogger("llamafactory.liger_core").info(
            "liger_core: off (set enable_liger_kernel: true to use it)%s",
            "; liger_kernel_config is ignored" if kernel_config else "",
        )
    from llamafactory.train.tuner import run_exp

    run_exp(args)


def _wants_torchrun() -> bool:
    from llamafactory.extras.misc import get_device_count, is_env_enabled, use_kt, use_ray

    if is_env_enabled("USE_MCA"):  # LLaMA-Factory forces torchrun for Megatron-core too
        os.environ["FORCE_TORCHRUN"] = "1"
    return is_env_enabled("FORCE_TORCHRUN") or (get_device_count() > 1 and not use_ray() and not use_kt())


def torchrun_command(argv: list[str]) -> list[str]:
    """``python -m torch.distributed.run ... -m liger_core_llamafactory.worker <argv>``, from LLaMA-Factory's
    launcher environment variables."""
    from llamafactory.extras.misc import find_available_port, get_device_count

    nnodes = os.getenv("NNODES", "1")
    nproc = os.getenv("NPROC_PER_NODE", str(max(get_device_count(), 1)))
    master_addr = os.getenv("MASTER_ADDR", "127.0.0.1")
    master_port = os.getenv("MASTER_PORT", str(find_available_port()))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", nproc]
    if os.getenv("RDZV_ID") is not None:  # elastic launch, as LLaMA-Factory does it
        min_nnodes, max_nnodes = os.getenv("MIN_NNODES"), os.getenv("MAX_NNODES")
        rdzv_nnodes = f"{min_nnodes}:{max_nnodes}" if min_nnodes and max_nnodes else nnodes
        cmd += ["--nnodes", rdzv_nnodes, "--rdzv-id", os.environ["RDZV_ID"], "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", f"{master_addr}:{master_port}"]
        cmd += ["--max-restarts", os.getenv("MAX_RESTARTS", "0")]
    else:
        cmd += ["--nnodes", nnodes, "--node-rank", os.getenv("NODE_RANK", "0")]
        cmd += ["--master-addr", master_addr, "--master-port", master_port]
    return [*cmd, "-m", "liger_core_llamafactory.worker", *argv]


def train(argv: list[str]) -> int:
    from llamafactory.extras.misc import is_env_enabled

    if is_env_enabled("USE_V1"):  # LLaMA-Factory's experimental v1 trainer: its own kernel plugins
        if pop_liger_flag(read_train_args(argv)) or env_enabled():
            raise SystemExit("liger-lmf: liger_core supports LLaMA-Factory's default trainer; unset USE_V1")
        from llamafactory.cli import main as llamafactory_main

        sys.argv = ["llamafactory-cli", "train", *argv]
        llamafactory_main()
        return 0
    if not _wants_torchrun():
        run_training(argv)
        return 0
    # Decide here so a bad value fails before any worker starts; workers re-read the same arguments.
    args = read_train_args(argv)
    pop_kernel_config(args)
    if pop_liger_flag(args) or env_enabled():
        os.environ[ENV_FLAG] = "1"
    env = dict(os.environ)
    if env.get("OPTIM_TORCH", "1").lower() in ("1", "true"):  # LLaMA-Factory's DDP settings
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        env["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "1"
    cmd = torchrun_command(argv)
    print(f"liger-lmf: launching {' '.join(cmd)} ({ENV_FLAG}={env.get(ENV_FLAG, '0')})", flush=True)
    return subprocess.run(cmd, env=env).returncode
