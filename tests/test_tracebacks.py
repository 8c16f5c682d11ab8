"""A script's own worker function, sent by value, fails remotely with a traceback that names the
script's file and shows the failing line, as with multiprocessing (cloudpickle 3.1.3 writes
``<dynamic-code>`` as every such function's file name). Run with the lowest cloudpickle the
range in pyproject.toml allows and with the version constraints.txt pins (the newest tested)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent('''\
    import sys
    from concurrent.futures import ProcessPoolExecutor

    import cloudpickle
    import fibercore as mp


    def boom(x):
        raise ValueError(f"boom {x}")  # the failing line


    if __name__ == "__main__":
        print("cloudpickle", cloudpickle.__version__, flush=True)
        which = sys.argv[1]
        if which == "pool":
            with mp.Pool(1) as pool:
                pool.map(boom, [1])
        elif which == "process":
            p = mp.Process(target=boom, args=(2,))
            p.start()
            p.join()
            sys.exit(p.exitcode)
        else:
            with ProcessPoolExecutor(1, mp_context=mp.get_context()) as ex:
                ex.submit(boom, 3).result()
''')


def _lowest() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("cloudpickle"))
    return re.search(r">=\s*([0-9.]+)", spec).group(1)  # type: ignore[union-attr]


def _pinned() -> str:
    return re.search(r"^cloudpickle==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)  # type: ignore[union-attr]


@pytest.fixture(scope="module", params=["lowest", "pinned"])
def cloudpickle_dir(request, tmp_path_factory):
    """A directory holding only the given cloudpickle, to put first on PYTHONPATH."""
    version = _lowest() if request.param == "lowest" else _pinned()
    target = tmp_path_factory.mktemp(f"cloudpickle-{version}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    f"cloudpickle=={version}"], check=True, capture_output=True)
    return version, target


@pytest.mark.parametrize("how", ["pool", "process", "executor"])
def test_main_function_traceback_names_the_file_and_line(cloudpickle_dir, how, tmp_path):
    version, target = cloudpickle_dir
    app = tmp_path / "myapp.py"
    app.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(app), how], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    printed = re.search(r"^cloudpickle (\S+)$", proc.stdout, re.M)
    assert printed and Version(printed.group(1)) == Version(version), out
    assert proc.returncode != 0
    assert f'File "{app}", line 9, in boom' in out, out
    assert 'raise ValueError(f"boom {x}")  # the failing line' in out, out
    assert "<dynamic-code>" not in out, out


def test_source_line_shows_where_the_file_is_not(tmp_path):
    """A function whose file the receiver cannot read (a container, another host) still shows
    its line: the source travels with the code."""
    code = textwrap.dedent('''\
        import subprocess, sys
        import cloudpickle  # noqa: F401
        from fibercore.builtins.cloudpickle_serializer import CloudpickleSerializer
        src = "def g(x):\\n    return 1 / x  # divide\\n"
        ns = {"__name__": "__main__"}
        import linecache
        linecache.cache["/nowhere/app.py"] = (len(src), None, src.splitlines(True), "/nowhere/app.py")
        exec(compile(src, "/nowhere/app.py", "exec"), ns)
        import pickle
        parts = CloudpickleSerializer().dumps(ns["g"])
        sys.stdout.buffer.write(pickle.dumps(parts))
    ''')
    blob = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    receiver = textwrap.dedent('''\
        import pickle, sys, traceback
        from fibercore.builtins.cloudpickle_serializer import CloudpickleSerializer
        g = CloudpickleSerializer().loads(pickle.loads(sys.stdin.buffer.read()))
        try:
            g(0)
        except ZeroDivisionError:
            traceback.print_exc()
    ''')
    out = subprocess.run([sys.executable, "-c", receiver], input=blob, capture_output=True, check=True).stderr
    text = out.decode()
    assert 'File "/nowhere/app.py", line 2, in g' in text, text
    assert "return 1 / x  # divide" in text, text
