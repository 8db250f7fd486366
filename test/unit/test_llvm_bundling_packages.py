"""A package that bundles its own LLVM (triton) and opfuse's CPU JIT in one process.

The JIT's runtime libraries pull the wheels' libLLVM.so into the process's global
namespace; a bundled LLVM loaded after that registers its command-line options twice and
aborts the process (LLVM ERROR "Option 'bitcode-mdindex-threshold' registered more than
once"), which torch triggers on its own by importing triton in torch.export and Dynamo.
runtime.cpu imports such packages before its first engine. Checked in a fresh interpreter
with a stand-in ``triton`` that records whether LLVM's symbols were already global when it
was imported (runs everywhere), and with the real triton where it is installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

RUN_CPU_CODE = textwrap.dedent("""
    import ctypes, numpy as np, opfuse
    from opfuse.builder import Graph
    g = Graph("t"); x = g.input("x", (4, 8)); g.output(g.tanh(x))
    got = opfuse.compile(g, backend="cpu")(np.ones((4, 8), np.float32))
    assert np.allclose(got, np.tanh(1.0))
    # the hazard is real: after the engine, LLVM's C API resolves from the process
    print("llvm global after the engine:", hasattr(ctypes.CDLL(None), "LLVMContextCreate"))
""")


def _python(code: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)


def test_a_bundling_package_is_loaded_before_llvm_is_global(tmp_path):
    fake = tmp_path / "triton"
    fake.mkdir()
    (fake / "__init__.py").write_text(textwrap.dedent("""
        import ctypes
        print("stand-in triton imported; llvm global then:",
              hasattr(ctypes.CDLL(None), "LLVMContextCreate"))
    """))
    proc = _python(RUN_CPU_CODE, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "stand-in triton imported; llvm global then: False" in proc.stdout, proc.stdout
    assert "llvm global after the engine: True" in proc.stdout, proc.stdout


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="triton is not installed (the bench extra installs it)")
def test_triton_imported_after_cpu_code_does_not_abort():
    proc = _python(RUN_CPU_CODE + "\nimport triton\nprint('triton', triton.__version__)\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "triton 3." in proc.stdout


RUN_CPU_CODE_ON_THREADS = textwrap.dedent("""
    import ctypes, threading, time, numpy as np, opfuse
    from opfuse.builder import Graph
    g = Graph("t"); x = g.input("x", (4, 8)); g.output(g.tanh(x))
    programs = [opfuse.compile(g, backend="cpu") for _ in range(3)]  # JIT on first call
    errors = []
    def first_call(p):
        try:
            assert np.allclose(p(np.ones((4, 8), np.float32)), np.tanh(1.0))
        except Exception as e:
            errors.append(e)
    threads = [threading.Thread(target=first_call, args=(p,)) for p in programs]
    threads[0].start()
    time.sleep(1.5)  # the first thread is inside the bundling package's import now
    [t.start() for t in threads[1:]]; [t.join() for t in threads]
    print("errors:", errors)
""")


def test_threads_making_their_first_programs_wait_for_the_bundling_package(tmp_path):
    # The package is in sys.modules from the moment one thread starts importing it: the
    # others must wait for it to finish before they build an engine (before the fix the
    # slow stand-in below saw LLVM already global, and the real triton aborted the
    # process: "Option 'bitcode-mdindex-threshold' registered more than once").
    fake = tmp_path / "triton"
    fake.mkdir()
    (fake / "__init__.py").write_text(textwrap.dedent("""
        import ctypes, time
        time.sleep(4.0)  # the other threads' engines would be built meanwhile
        print("stand-in triton imported; llvm global then:",
              hasattr(ctypes.CDLL(None), "LLVMContextCreate"))
    """))
    proc = _python(RUN_CPU_CODE_ON_THREADS, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "stand-in triton imported; llvm global then: False" in proc.stdout, proc.stdout
    assert proc.stdout.count("stand-in triton imported") == 1, proc.stdout
    assert "errors: []" in proc.stdout, proc.stdout
