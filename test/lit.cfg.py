# lit configuration for opfuse: test/passes, test/tools, test/codegen, test/python.
#
# Run with the lit of the environment opfuse is installed in:
#     lit -v test            (or one suite: lit -v test/tools)
# Tools (fuse-opt, fuse-run, filecheck) come from that environment's bin directory.
# `filecheck` is the Python port of LLVM's FileCheck (no numeric [[#N]] variables, no
# --implicit-check-not, `[[# @LINE + 1]]` with exactly those spaces instead of [[@LINE+1]];
# CHECK-DAG prints a debug line to stdout). CHECK, -NEXT, -SAME, -NOT, -LABEL, -DAG,
# -COUNT-n, -EMPTY, {{regex}} and [[X:regex]] captures work, as do --check-prefix(es).

import importlib.util
import os
import shutil
import subprocess
import sys

import lit.formats

config.name = "opfuse"  # noqa: F821 (lit injects `config`)
# lit's internal shell: portable, and the only one lit keeps from LLVM 24 on
# (ShTest(True) is refused by lit 23). It has no `$?`: check exit codes with %expect-exit.
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
# no test_exec_root: %t lands in test/<suite>/Output/, which .gitignore covers
config.excludes = [
    "Inputs",  # helper inputs of tests, not tests
    "unit",  # pytest, run by pytest
    "lit.cfg.py",
    "lit.site.cfg.py",
    "conftest.py",
    "__pycache__",
    "Output",
]

# The environment that runs lit is the one under test: its bin directory first on PATH.
bin_dir = os.path.dirname(sys.executable)
path = config.environment.get("PATH", os.environ.get("PATH", ""))
config.environment["PATH"] = os.pathsep.join([bin_dir, path])
for var in ("HOME", "TMPDIR", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
for var, value in os.environ.items():  # OPFUSE_DUMP_DIR, OPFUSE_CACHE_DIR, OPFUSE_DEBUG, ...
    if var.startswith("OPFUSE_"):
        config.environment[var] = value
# analyses a pass reuses from an earlier one are checked against a fresh build (config.py)
config.environment.setdefault("OPFUSE_CHECK_ANALYSES", "1")

config.substitutions.append(("%PYTHON", f'"{sys.executable}"'))
# `%expect-exit 1 fuse-opt bad.mlir`: succeeds when the command exits with exactly that code
# (`not` accepts any failure; this tells a user error, 1, from an internal error, 2).
_EXPECT_EXIT = (
    "import subprocess, sys; "
    "sys.exit(0 if subprocess.call(sys.argv[2:]) == int(sys.argv[1]) else 1)"
)
config.substitutions.append(("%expect-exit", f'"{sys.executable}" -c "{_EXPECT_EXIT}"'))

for tool in ("fuse-opt", "filecheck"):
    if not shutil.which(tool, path=config.environment["PATH"]):
        lit_config.warning(  # noqa: F821 (lit injects `lit_config`)
            f"{tool} not found in {bin_dir}: is opfuse installed in this environment?"
        )


def _cuda_available() -> bool:
    """A GPU that answers nvidia-smi, and a PyCUDA that imports (`REQUIRES: cuda`)."""
    if not shutil.which("nvidia-smi"):
        return False
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30)
        if smi.returncode != 0:
            return False
        probe = subprocess.run(
            [sys.executable, "-c", "import pycuda.driver"], capture_output=True, timeout=60
        )
        return probe.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


if _cuda_available():
    config.available_features.add("cuda")
if shutil.which("ptxas", path=config.environment["PATH"]):
    config.available_features.add("ptxas")
if importlib.util.find_spec("torch") is not None:
    config.available_features.add("torch")
