"""``liger-core-axolotl``: the ``axolotl`` command, with the config checked first.

Axolotl imports each entry of ``plugins:`` and, when one fails, logs the error and carries on without it;
pydantic then drops that plugin's keys, so ``use_liger_kernel: true`` with a misspelled or uninstalled plugin
trains without liger_core and says so only in a log line. Before delegating, this wrapper reads the YAML and
stops (exit status 2) if:
- an entry of ``plugins:`` cannot be imported (with a "did you mean" for ours);
- ``use_liger_kernel`` / ``liger_core_*`` keys are set but ``liger_core_axolotl.LigerCorePlugin`` is not
  listed;
- the keys conflict (the same checks the plugin's pydantic model runs).

    liger-core-axolotl train config.yaml [axolotl options]   (any axolotl command taking a config)
    liger-core-axolotl check config.yaml                     (only the checks)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from liger_core_axolotl.args import OUR_KEYS, PLUGIN_NAME, config_conflicts, truthy
from liger_core_axolotl.preflight import failed_plugin_message, looks_like_ours, resolve_plugin


def check_config(data: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(errors, warnings) for a raw Axolotl config dict."""
    from liger_core_axolotl.args import misspelled_keys
    from liger_core_axolotl.plugin import LigerCorePlugin

    errors: list[str] = list(misspelled_keys(data))
    warnings: list[str] = []
    ours_listed = False
    for name in [str(p) for p in data.get("plugins") or []]:
        try:
            cls = resolve_plugin(name)
        except Exception as e:  # ImportError and whatever the plugin's module raises at import
            if looks_like_ours(name):
                errors.append(failed_plugin_message(name).removeprefix("liger_core_axolotl: "))
            else:
                errors.append(
                    f"plugin {name!r} cannot be imported ({type(e).__name__}: {e}); Axolotl would skip it "
                    "and ignore its config keys."
                )
            continue
        ours_listed |= isinstance(cls, type) and issubclass(cls, LigerCorePlugin)
    our_keys = [k for k in OUR_KEYS if data.get(k) is not None]
    if our_keys and not ours_listed:
        errors.append(
            f"{', '.join(our_keys)} set, but {PLUGIN_NAME} is not under `plugins:`; Axolotl would ignore "
            f"these keys and train without liger_core. Add:\n  plugins:\n    - {PLUGIN_NAME}"
        )
    if ours_listed:
        errors.extend(config_conflicts(data))
        if not truthy(data.get("use_liger_kernel")):
            warnings.append(
                f"{PLUGIN_NAME} is listed but `use_liger_kernel: true` is not set: liger_core is off"
            )
    return errors, warnings


def find_config(args: list[str]) -> Path | None:
    for arg in args:
        if not arg.startswith("-") and (arg.endswith((".yml", ".yaml")) or Path(arg).is_file()):
            return Path(arg)
    return None


def check_file(path: Path) -> int:
    """Print the findings for one config file; 0 if it may run."""
    import yaml

    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    errors, warnings = check_config(data)
    for w in warnings:
        print(f"liger-core-axolotl: warning: {w}", file=sys.stderr)
    for e in errors:
        print(f"liger-core-axolotl: ERROR in {path}: {e}", file=sys.stderr)
    return 2 if errors else 0


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    command, rest = argv[0], argv[1:]
    config = find_config(rest)
    if command == "check":
        if config is None:
            sys.exit("usage: liger-core-axolotl check config.yaml")
        status = check_file(config)
        if status == 0:
            print(f"liger-core-axolotl: {config} OK")
        sys.exit(status)
    if config is not None and not str(config).startswith(("http://", "https://")):
        status = check_file(config)
        if status:
            sys.exit(status)
    from axolotl.cli.main import main as axolotl_main

    sys.argv = ["axolotl", *argv]
    axolotl_main()
