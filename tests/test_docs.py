"""The documentation's code runs, and the docs stand alone.

- every ```python block of docs/tutorial.md runs, in order, in one namespace;
- every ```python block of README.md runs, each in its own namespace;
- every `dpfl ...` command of the README's and the docs' ```bash blocks parses
  with the real parser (nothing is run: some are long trainings);
- no page cites a file outside the repository or links outside the site.

Each runs in a temporary working directory, so nothing is written into the
source tree. ``mkdocs build --strict`` (in .ci/run) checks links and anchors.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))


def _blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(), flags=re.S)


def _dpfl_commands(block: str) -> list[list[str]]:
    """The ``dpfl ...`` commands of a bash block, as argument lists.

    Continuation lines are joined; each ``&&``-separated part that starts with
    ``dpfl`` is one command; ``# comments`` are dropped by shlex.
    """
    text = block.replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words[:1] == ["dpfl"]:
                commands.append(words[1:])
    return commands


def _exec(code: str, namespace: dict, name: str) -> None:
    exec(compile(code, name, "exec"), namespace)  # noqa: S102


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_tutorial_runs_in_order(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    blocks = _blocks(DOCS / "tutorial.md", "python")
    assert len(blocks) >= 4, "the tutorial lost its steps"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, block in enumerate(blocks):
        _exec(block, namespace, f"docs/tutorial.md, python block {i + 1}")
    # The blocks assert their own results; check the run's end state too.
    trainer = namespace["trainer"].trainer
    assert trainer.round == trainer.ledger.rounds == 5
    assert 0 < namespace["audit"].epsilon <= namespace["claimed"]


def _readme_python() -> list[str]:
    return _blocks(ROOT / "README.md", "python")


@pytest.mark.parametrize("index", range(len(_readme_python())))
def test_readme_python_block_runs(index, tmp_path, monkeypatch):
    block = _readme_python()[index]
    if "torch" in block:
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    _exec(block, namespace, f"README.md, python block {index + 1}")
    # What the README's examples promise: a certified bracket; a trainer whose
    # ledger charged every round it ran.
    if "bound" in namespace:
        assert 0 < namespace["bound"].lower <= namespace["bound"].upper
    if "trainer" in namespace:
        trainer = namespace["trainer"]
        loop = getattr(trainer, "trainer", trainer)  # make_private's wraps the loop
        assert loop.round > 0
        assert loop.ledger.rounds == loop.round


def _documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in [ROOT / "README.md", *PAGES]:
        for block in _blocks(path, "bash"):
            for argv in _dpfl_commands(block):
                found.append((path.relative_to(ROOT).as_posix(), argv))
    return found


def test_documented_commands_are_found():
    sources = {source for source, _ in _documented_commands()}
    assert "README.md" in sources and "docs/getting-started.md" in sources
    assert len(_documented_commands()) >= 20


@pytest.mark.parametrize(
    ("source", "argv"),
    _documented_commands(),
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_documented_command_parses(source, argv):
    from dpfl.cli.main import build_parser

    if argv and argv[0] in ("train", "resume", "plot", "reproduce", "demo"):
        pytest.importorskip("torch")
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse's way of refusing a command line
        pytest.fail(f"{source}: `dpfl {' '.join(argv)}` does not parse ({exc})")
    assert args.command == argv[0]
    for word in argv:  # a config named on the command line exists
        if word.endswith(".yaml"):
            assert (ROOT / word).is_file(), f"{source}: {word} does not exist"
    if argv[0] in ("train", "sweep"):  # a file, or a preset that ships
        from dpfl.experiments.presets import resolve_config

        assert (ROOT / resolve_config(argv[1])).is_file(), (source, argv[1])


# Files of the project's private workspace, which a clone does not have.
FORBIDDEN = (
    "SPEC.md",
    "DESIGN.md",
    "STYLE.md",
    "shared/",
    "papers/",
    "random-participation.txt",
    "client-level-dp-fedavg.txt",
    "federated-f-dp.txt",
    "ms-pafl.txt",
    "locks.txt",
)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_stands_alone(page):
    text = page.read_text()
    for word in FORBIDDEN:
        assert word not in text, f"{page.name} mentions {word!r}"
    links = re.findall(r"\]\(([^)]+)\)", text)
    outside = [link for link in links if re.match(r"[a-z]+:", link)]
    assert not outside, f"{page.name} links outside the site: {outside}"
