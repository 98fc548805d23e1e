"""Ships ``liger_core_axolotl_hook.pth`` at the root of site-packages, in wheels and editable installs.

Python's ``site`` module runs its line (``import liger_core_axolotl.import_hook``) at interpreter start,
which makes plain ``axolotl`` stop on a liger_core config it would ignore (see that module). setuptools has
no option for a top-level ``.pth``, so ``build_py`` copies it: into the build directory for a wheel, and for
an editable install (PEP 660) into the editable wheel's root, which ``install_lib`` points at there.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "liger_core_axolotl_hook.pth"


class BuildPyWithStartupHook(build_py):
    def run(self):
        super().run()
        source = str(Path(__file__).resolve().parent / PTH)
        if getattr(self, "editable_mode", False):
            target_dir = self.get_finalized_command("install").install_lib
        else:
            target_dir = self.build_lib
        self.mkpath(target_dir)
        self.copy_file(source, str(Path(target_dir) / PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs.append(str(Path(self.build_lib) / PTH))
        return outputs


setup(cmdclass={"build_py": BuildPyWithStartupHook})
