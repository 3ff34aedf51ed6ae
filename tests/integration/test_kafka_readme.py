"""The README's Kafka section runs as written, against the session's broker: the payments
it produces are summed exactly.

The section's blocks are marked skipped for ``test_readme`` (they need a broker); this test
runs them in order in an empty directory, with the broker's address and a fresh topic name
in place of the README's, skipping the lines that install packages or start a broker.
"""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

from tests.support.readme import ROOT, examples, localized, sums_in

SECTION = "## Reading a Kafka topic"
FILES = ("produce.py", "payments.py")


def _section_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.index("\n### ", start + len(SECTION))  # the writing half is a fragment
    first, last = text.count("\n", 0, start), text.count("\n", 0, end)
    return [(e.lang, e.code) for e in examples(ROOT / "README.md") if first <= e.line <= last]


def _run(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(line, comments=True)
    if argv[0] == "python":
        argv[0] = sys.executable
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        argv,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_readme_kafka_section_is_exact(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    blocks = _section_blocks()
    python = [code for lang, code in blocks if lang == "python"]
    assert len(python) == len(FILES)
    for name, code in zip(FILES, python, strict=True):
        code = localized(code, tmp_path).replace("127.0.0.1:9092", kafka_bootstrap)
        (tmp_path / name).write_text(code.replace('"payments"', f'"{topic}"'))
    ran = []
    for lang, code in blocks:
        if lang != "bash":
            continue
        for line in code.splitlines():
            if not line.strip() or line.split()[0] in ("pip", "noida-db"):
                continue
            result = _run(line, tmp_path)
            assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}"
            ran.append(line)
            if "payments.py" in line:
                assert "drained" in result.stdout, result.stdout
    assert ran == ["python produce.py", "python payments.py"]
    expected: dict[int, int] = {}
    for i in range(10_000):
        expected[i % 100] = expected.get(i % 100, 0) + i
    assert sums_in(f"sqlite:///{tmp_path}/payments.db") == expected


WRITING = "### Writing to Kafka"


def test_readme_writing_to_kafka_is_exact(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The writing half after the reading half's ``produce.py``: ``totals.py`` publishes
    the sums through a KafkaSink, ``check.py`` reads them back, exact."""
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    text = (ROOT / "README.md").read_text()
    start = text.index(WRITING)
    first, last = text.count("\n", 0, start), text.count("\n", 0, text.index("\n## ", start))
    blocks = [(e.lang, e.code) for e in examples(ROOT / "README.md") if first <= e.line <= last]
    produce = next(code for lang, code in _section_blocks() if lang == "python")
    python = [code for lang, code in blocks if lang == "python"]
    assert len(python) == 2
    for name, code in zip(("produce.py", "totals.py", "check.py"), [produce, *python], strict=True):
        code = localized(code, tmp_path).replace("127.0.0.1:9092", kafka_bootstrap)
        code = code.replace('"payment-totals"', f'"{topic}-totals"')
        (tmp_path / name).write_text(code.replace('"payments"', f'"{topic}"'))
    lines = [line for lang, code in blocks if lang == "bash" for line in code.splitlines()]
    assert lines == ["python totals.py", "python check.py"]
    outputs = []
    for line in ["python produce.py", *lines]:
        result = _run(line, tmp_path)
        assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}"
        outputs.append(result.stdout)
    assert "drained" in outputs[1], outputs[1]
    expected: dict[int, int] = {}
    for i in range(10_000):
        expected[i % 100] = expected.get(i % 100, 0) + i
    assert ast.literal_eval(outputs[2].strip().splitlines()[-1]) == expected
