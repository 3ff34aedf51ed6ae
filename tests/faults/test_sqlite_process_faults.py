"""The SQLite backend's process dies at a step of its multi-step work (a kill), or finds
the disk full for real (``RLIMIT_FSIZE``); the store, reopened or used on, must agree with
the model of what committed (see :mod:`tests.support.sqlite_faults`)."""

from __future__ import annotations

import os
import random
import resource
import signal
import traceback
from collections.abc import Callable
from pathlib import Path

from tests.support.sqlite_faults import PLAN, Op, random_program, reopened_check, run_program

PROGRAM_OPS = 12


def in_child(body: Callable[[int], None]) -> tuple[int, list[str]]:
    """Run ``body(fd)`` in a forked process; returns its wait status and the lines it
    wrote to ``fd`` (a traceback last if it raised)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.close(read_end)
        code = 0
        try:
            body(write_end)
        except BaseException:
            os.write(write_end, ("error " + traceback.format_exc()).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    while data := os.read(read_end, 65536):
        chunks.append(data)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return status, b"".join(chunks).decode().splitlines()


def _report(fd: int) -> Callable[[int], None]:
    return lambda n: os.write(fd, f"op {n}\n".encode()) and None


def test_a_kill_at_a_step_leaves_what_committed(small_store_units: None, tmp_path: Path) -> None:
    """The process is killed at a step (a statement, a merge's, a wake-up); a new
    process finds the store as the model was before or after the operation under way."""
    kills = 0
    for seed in (4, 5):
        program = random_program(random.Random(seed), PROGRAM_OPS)
        steps = run_program(tmp_path / f"count-{seed}.db", program)
        for at in range(seed % 3, steps, 3):
            path = tmp_path / f"{seed}-{at}.db"
            status, lines = in_child(
                lambda fd, path=path, at=at, program=program: run_program(  # type: ignore[misc]
                    path, program, at, "kill", before_op=_report(fd)
                )
            )
            assert not any(line.startswith("error") for line in lines), "\n".join(lines)
            ops = [int(line.split()[1]) for line in lines if line.startswith("op ")]
            killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            assert killed or status == 0, (status, lines)
            kills += killed
            reopened_check(path, program, ops[-1] if killed else len(program))
    assert kills > 50


def test_a_full_disk_fails_the_commit_and_the_process_goes_on(
    small_store_units: None, tmp_path: Path
) -> None:
    """Files may not grow past their size (plus a frame or none) during every third
    operation; the process goes on with the store after each failure, as a reducer that
    catches ``StoreUnavailableError`` does, and must read what the model says."""
    failed = 0
    for seed in (6, 7):
        program = random_program(random.Random(seed), PROGRAM_OPS)
        run_program(tmp_path / f"warm-{seed}.db", program)  # the children inherit the imports
        for phase in range(3):
            for spare in (0, 5000):
                path = tmp_path / f"{seed}-{phase}-{spare}.db"

                def body(
                    fd: int,
                    path: Path = path,
                    phase: int = phase,
                    spare: int = spare,
                    program: list[Op] = program,
                ) -> None:
                    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

                    def limit(n: int) -> None:
                        soft = hard
                        if n < len(program) and n % 3 == phase:
                            sizes = [f.stat().st_size for f in path.parent.glob(path.name + "*")]
                            soft = max(sizes) + spare
                        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

                    run_program(path, program, before_op=limit)
                    os.write(fd, f"failed {PLAN.failed_ops}\n".encode())

                status, lines = in_child(body)
                assert status == 0, "\n".join(lines)
                failed += int(lines[-1].split()[1])
    assert failed > 10  # operations the full disk failed
