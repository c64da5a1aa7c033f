"""Outputs never harm what they are written to (issue 58, item 1): a target that is not a
regular file (a character device, a FIFO, a socket, a process's descriptor such as
``/dev/stdout``, or a link to one) is written in place, never renamed over; its write errors (a
full device, a file-size limit, a reader gone) are one line and a non-zero exit; a disk or a
memory device is refused; stdout is checked the same way.

Every device here is made in the test's temporary folder (``os.mknod`` with ``/dev/null``'s and
``/dev/full``'s numbers, as root), never the machine's own; a file-size limit is set in the
child process only."""

from __future__ import annotations

import os
import resource
import socket
import stat
import subprocess
import sys
import threading

import pytest
from conftest import MODELS, ROOT, run_main

from phaze import outputs
from phaze.outputs import refuse_clashes, write_atomically, write_together
from phaze_ir.errors import PhazeError

MLIR = ROOT / "tests" / "filecheck" / "tile_pe_array.mlir"
#: A CSV whose every row is refused (75 layers over the bound): phaze-validate writes its report
#: without tracing anything.
REFUSED_CSV = (
    "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
    "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms),vocabulary\n"
    "1,2,1,64,2,5000,32,1,1,1,10,128\n"
)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")


def _device(path, like: tuple[int, int]) -> os.PathLike:
    """A character device node at ``path`` with the given (major, minor): (1, 3) is a null
    device, (1, 7) a full one (Linux's devices.txt)."""
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*like))
    return path


def _is_device(path, like: tuple[int, int]) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == like


NULL, FULL = (1, 3), (1, 7)


def _one_line(r: subprocess.CompletedProcess, tool: str, says: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.count(f"{tool}: error") == 1 and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def _child_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _limit_file_size(limit: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_limit


# -- character devices ------------------------------------------------------------------------


@root_only
def test_a_null_device_is_written_in_place_and_stays_a_device(tmp_path):
    null = _device(tmp_path / "null", NULL)
    write_atomically(null, "the plan\n")
    assert _is_device(null, NULL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary made beside it


@root_only
def test_a_full_device_is_an_error_and_the_regular_outputs_are_left_as_they_were(tmp_path):
    full = _device(tmp_path / "full", FULL)
    plan = tmp_path / "plan.mlir"
    plan.write_text("the previous plan\n")
    with pytest.raises(PhazeError, match=r"full: cannot write: No space left on device$"):
        write_together([(plan, "the new plan\n"), (full, "{}\n")])
    assert _is_device(full, FULL)
    assert plan.read_text() == "the previous plan\n"  # all or nothing still
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "plan.mlir"]


@root_only
def test_a_link_to_a_device_writes_the_device_and_stays_a_link(tmp_path):
    null = _device(tmp_path / "null", NULL)
    link = tmp_path / "out.json"
    link.symlink_to(null)
    write_atomically(link, "{}\n")
    assert link.is_symlink() and _is_device(null, NULL)


@root_only
def test_phaze_opt_on_a_full_device_says_one_line_and_leaves_the_device(tmp_path):
    full = _device(tmp_path / "full", FULL)
    r = run_main("phaze-opt", str(MLIR), "-o", str(full))
    _one_line(r, "phaze-opt", f"{full}: cannot write: No space left on device")
    assert _is_device(full, FULL)
    null = _device(tmp_path / "null", NULL)
    r = run_main("phaze-opt", str(MLIR), "-o", str(null))
    assert r.returncode == 0 and r.stderr == "" and _is_device(null, NULL)


@root_only
def test_phazec_outputs_on_devices_are_written_in_place(tmp_path):
    """The issue's `--export megatron /dev/null` and `/dev/full`, on nodes made here: -o to a
    null device, --json to a full one (through a link): one line, exit 1, both still devices."""
    null = _device(tmp_path / "null", NULL)
    full = _device(tmp_path / "full", FULL)
    (tmp_path / "plan.json").symlink_to(full)
    r = run_main(
        "phazec", str(MODELS / "tiny_gpt2.py"), "--hw", "tpuv4", "--micro-batch", "1", "--tp", "1", "-q",
        "-o", str(null), "--json", str(tmp_path / "plan.json"),
    )  # fmt: skip
    _one_line(r, "phazec", f"{tmp_path / 'plan.json'}: cannot write: No space left on device (written: {null})")
    assert _is_device(null, NULL) and _is_device(full, FULL) and (tmp_path / "plan.json").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "null", "plan.json"]


@root_only
def test_two_outputs_to_one_character_device_are_fine_but_not_to_one_fifo(tmp_path):
    null = str(_device(tmp_path / "null", NULL))
    refuse_clashes([], [("-o", null), ("--json", null), ("--report", null)])
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    with pytest.raises(PhazeError, match="is also -o: give each output its own file"):
        refuse_clashes([], [("-o", fifo), ("--json", fifo)])


def _stat(mode: int, major: int = 0, minor: int = 0) -> os.stat_result:
    """A made-up stat of a file of this mode and device numbers."""
    return os.stat_result((mode, 0, 0, 1, 0, 0, 0, 0, 0, 0), {"st_rdev": os.makedev(major, minor)})


@pytest.mark.parametrize(
    "st, says",
    [
        (_stat(stat.S_IFBLK | 0o660, 8, 0), "is a block device (a disk): refusing to write onto it"),
        (_stat(stat.S_IFCHR | 0o640, 1, 1), "is the memory device /dev/mem: refusing to write onto it"),
        (_stat(stat.S_IFCHR | 0o640, 1, 4), "is the memory device /dev/port: refusing to write onto it"),
        (_stat(stat.S_IFDIR | 0o755), "is a directory, expected a file name"),
    ],
)
def test_a_disk_or_memory_is_refused_without_opening_it(st, says):
    """Judged on the file's kind (a made-up stat: no disk or memory device is made or opened)."""
    assert outputs._refusal(st) == says


def test_the_kinds_written_in_place_are_not_refused():
    for st in (_stat(stat.S_IFCHR | 0o666, 1, 3), _stat(stat.S_IFIFO | 0o644), _stat(stat.S_IFSOCK | 0o755)):
        assert outputs._refusal(st) is None


# -- FIFOs, sockets, descriptors --------------------------------------------------------------


def _read_in_thread(path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=read)
    t.start()
    return t, got


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t, got = _read_in_thread(fifo)
    write_atomically(fifo, "the plan\n" * 10_000)  # more than a pipe holds
    t.join(timeout=60)
    assert got == [b"the plan\n" * 10_000] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_nothing_reads_is_one_error_not_a_hang(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "FIFO_READER_WAIT_S", 0.0)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(PhazeError, match=r"fifo: cannot write: the FIFO has no reader \(waited 0 s for one\)"):
        write_atomically(fifo, "x\n")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_socket_is_sent_to_in_place(tmp_path):
    path = str(tmp_path / "sock")
    got: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                chunks = []
                while chunk := conn.recv(65536):
                    chunks.append(chunk)
                got.append(b"".join(chunks))

        t = threading.Thread(target=serve)
        t.start()
        write_atomically(path, "the plan\n")
        t.join(timeout=60)
    assert got == [b"the plan\n"] and stat.S_ISSOCK(os.lstat(path).st_mode)


def test_a_link_to_a_regular_file_stays_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old\n")
    link = tmp_path / "plan.json"
    link.symlink_to(real)
    write_atomically(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_a_descriptor_to_a_regular_file_is_written_in_place(tmp_path):
    """``-o /dev/stdout`` with stdout redirected to a file: the file gets the module, as ``tee
    /dev/stdout`` would write it, and the link (made here, not the machine's /dev/stdout) stays."""
    stdout_link = tmp_path / "stdout"
    stdout_link.symlink_to("/proc/self/fd/1")
    out = tmp_path / "out.mlir"
    with open(out, "w") as f:
        r = subprocess.run(
            [sys.executable, "-m", "phaze.tools.phaze_opt", str(MLIR), "-o", str(stdout_link)],
            stdout=f, stderr=subprocess.PIPE, text=True, env=_child_env(), timeout=600,
        )  # fmt: skip
    assert r.returncode == 0 and r.stderr == ""
    assert out.read_text().startswith("builtin.module") and stdout_link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mlir", "stdout"]


def test_a_descriptor_pipe_whose_reader_is_gone_is_one_line(tmp_path):
    """``-o /dev/stdout`` into a pipe nothing reads any more: no wait for a reader, one line."""
    stdout_link = tmp_path / "stdout"
    stdout_link.symlink_to("/proc/self/fd/1")
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "phaze.tools.phaze_opt", str(MLIR), "-o", str(stdout_link)],
            stdout=w, stderr=subprocess.PIPE, text=True, env=_child_env(), timeout=600,
        )  # fmt: skip
    finally:
        os.close(w)
    _one_line(p, "phaze-opt", f"{stdout_link}: cannot write: Broken pipe")


# -- stdout -----------------------------------------------------------------------------------


def test_phaze_opt_stdout_cut_by_a_file_size_limit_is_an_error(tmp_path):
    """The issue's `ulimit -f`: Python's buffered stdout dropped what a short write left and
    exited 0; now one line and exit 1."""
    out = tmp_path / "out.mlir"
    with open(out, "w") as f:
        r = subprocess.run(
            [sys.executable, "-m", "phaze.tools.phaze_opt", str(MLIR)],
            stdout=f, stderr=subprocess.PIPE, text=True, env=_child_env(), timeout=600,
            preexec_fn=_limit_file_size(1024),
        )  # fmt: skip
    _one_line(r, "phaze-opt", "phaze-opt: error: stdout: cannot write: File too large")
    assert out.stat().st_size == 1024


def test_phaze_opt_stdout_into_a_closed_pipe_is_one_line():
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "phaze.tools.phaze_opt", str(MLIR)],
            stdout=w, stderr=subprocess.PIPE, text=True, env=_child_env(), timeout=600,
        )  # fmt: skip
    finally:
        os.close(w)
    _one_line(p, "phaze-opt", "phaze-opt: error: stdout: cannot write: Broken pipe")


def test_phazec_plan_on_stdout_cut_by_a_file_size_limit_is_an_error(tmp_path):
    out = tmp_path / "out.mlir"
    with open(out, "w") as f:
        r = subprocess.run(
            [sys.executable, "-m", "phaze.tools.phazec", str(MODELS / "tiny_gpt2.py"), "--emit", "ir", "-q"],
            stdout=f, stderr=subprocess.PIPE, text=True, env=_child_env(), timeout=600,
            preexec_fn=_limit_file_size(16384),
        )  # fmt: skip
    _one_line(r, "phazec", "phazec: error: stdout: cannot write: File too large")


@root_only
def test_phaze_validate_json_and_stdout_on_a_full_device(tmp_path):
    csv = tmp_path / "runs.csv"
    csv.write_text(REFUSED_CSV)
    full = _device(tmp_path / "full", FULL)
    cmd = [sys.executable, "-m", "phaze.tools.phaze_validate", str(csv), "--hw", "a100", "-q", "--summary-only"]
    r = subprocess.run([*cmd, "--json", str(full)], capture_output=True, text=True, env=_child_env(), timeout=600)
    _one_line(r, "phaze-validate", f"{full}: cannot write: No space left on device")
    with open(full, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, env=_child_env(), timeout=600)
    _one_line(r, "phaze-validate", "phaze-validate: error: stdout: cannot write: No space left on device")
    assert _is_device(full, FULL)


@pytest.mark.parametrize("tool", ["phazec", "phaze_validate"])
def test_no_usable_temporary_folder_is_one_line_before_the_work(tmp_path, tool):
    """No file can be written (``ulimit -f 0``): no temporary folder is usable, said in one line
    with exit status 1 before any work (phaze-validate's was a traceback where it made the
    folder of its model files; phazec's said that torch cannot be initialized twice, torch's
    first import having failed inside a library that went on)."""
    args = [str(ROOT / "examples" / "mlp.py"), "--hw", "h100", "-o", str(tmp_path / "plan.mlir")]
    if tool == "phaze_validate":
        args = [str(ROOT / "tests" / "data" / "vtrain_single_sample.csv"), "--hw", "a100", "-j", "1"]
    r = subprocess.run(
        [sys.executable, "-m", f"phaze.tools.{tool}", *args],
        capture_output=True,
        text=True,
        env={**_child_env(), "TMPDIR": str(tmp_path)},
        timeout=600,
        preexec_fn=_limit_file_size(0),
    )
    _one_line(r, tool.replace("_", "-"), "error: no usable temporary folder (TMPDIR): No usable temporary directory")
    assert r.stdout == "" and not (tmp_path / "plan.mlir").exists()


def test_a_model_file_not_written_stops_the_run_not_the_row(tmp_path, monkeypatch):
    """A model file that cannot be written is raised out of the pricing (the run stops), where a
    model that cannot be built leaves its rows unpriced."""
    from phaze import validate as v

    def cannot(shape, directory):
        raise v.ModelFileNotWritten(f"cannot write the model file of {shape.name} (x): No space left on device")

    monkeypatch.setattr(v, "write_model_file", cannot)
    runs = v.read_runs(ROOT / "tests" / "data" / "vtrain_single_sample.csv")
    settings = v.Settings(v.pricing_options("a100"), cache_dir=str(tmp_path), quiet=True)
    with pytest.raises(v.ModelFileNotWritten, match="No space left on device"):
        v.price_job(v.jobs_of(runs)[0], settings)


def test_phaze_validate_s_model_file_that_cannot_be_written_is_one_line(tmp_path):
    """phaze-validate writes each run's GPT as a model file in a temporary folder; a full disk or
    ``ulimit -f`` there was an ``OSError`` traceback out of the worker (session 64's probe
    round); now one line naming the file, which stops the run (the test above)."""
    from phaze import validate as v

    shape = v.read_runs(ROOT / "tests" / "data" / "vtrain_single_sample.csv")[0].shape
    with pytest.raises(PhazeError) as info:
        v.write_model_file(shape, tmp_path / "no" / "such" / "folder")
    message = str(info.value)
    assert message.startswith(f"cannot write the model file of {shape.name} (") and "\n" not in message, message
    assert message.endswith("): No such file or directory"), message
    ok = v.write_model_file(shape, tmp_path)
    assert os.path.isfile(ok)
