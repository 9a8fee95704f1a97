"""Build the project's wheel and install it (pip, not editable) into a fresh venv.

The wheel is built from a scratch copy of the checkout (`pip wheel --no-deps`), so the build
leaves no build/ folder in the working tree. The venv is made by this Python's `venv` without
the project: its dependencies come one of two ways, `CDC_TEST_WHEEL_DEPS` chooses:

- `linked` (default, 7-8 s on 2 cores and no disk: hard links): exactly the distributions the
  wheel's Requires-Dist needs with the extras asked for (none: the light install, pyspark-client
  only; `spark`: the full pyspark too), their closure (extras followed, markers evaluated),
  hard-linked file by file from this venv's RECORDs, which `make install` filled under
  docker/constraints.txt; their console scripts rewritten for the new Python. The project's own editable install is never
  among them, nor a dev-only package. `pip check` then proves the wheel's requirements hold.
- `index`: `pip install --constraint` from the package index as a user would (1.2 GB; on 2
  cores 59 s with pip's cache warm, 1 min 48 s with only the downloads cached).

Either way the wheel itself is installed by pip.
"""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("cdc_pipeline", "cdc_airflow", "spark_jobs", "cdc_tools")
# Top-level entries of the checkout a build never reads (venvs, fetched tools, data, caches).
NOT_COPIED = {
    ".git",
    ".venv",
    ".tools",
    "jars",
    "build",
    "dist",
    "landing",
    "warehouse",
    "airflow_home",
    "bench-results",
    "test-artifacts",
    "spark-warehouse",
    "metastore_db",
}
CACHES = ("__pycache__", "*.egg-info", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis")


def build_wheel(scratch: Path) -> Path:
    """`pip wheel --no-deps` of a copy of the checkout (`scratch`/source); the wheel's path."""
    source = scratch / "source"
    ignore_caches = shutil.ignore_patterns(*CACHES)

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = set(ignore_caches(folder, names))
        return skipped | (NOT_COPIED & set(names) if Path(folder) == REPO else set())

    shutil.copytree(REPO, source, ignore=ignore, symlinks=True)
    dist = scratch / "dist"
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(source)]
    )
    (wheel,) = dist.glob("*.whl")
    return wheel


def wheel_names(wheel: Path) -> list[str]:
    """The file names inside the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def wheel_modules(wheel: Path) -> set[str]:
    """The dotted names of the modules the wheel holds."""
    return {
        ".".join(Path(name).with_suffix("").parts).removesuffix(".__init__")
        for name in wheel_names(wheel)
        if name.endswith(".py")
    }


def source_modules(root: Path) -> set[str]:
    """The dotted names of the four packages' modules in a source tree (the copy the wheel
    was built from: others may add modules to the checkout meanwhile)."""
    return {
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for package in PACKAGES
        for path in (root / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }


def wheel_metadata(wheel: Path, name: str) -> str:
    """A file of the wheel's .dist-info folder (METADATA, entry_points.txt)."""
    with zipfile.ZipFile(wheel) as archive:
        (path,) = [n for n in archive.namelist() if n.endswith(f".dist-info/{name}")]
        return archive.read(path).decode()


def requirements_of(wheel: Path) -> list[Requirement]:
    """The wheel's Requires-Dist lines (all of them, extras' ones included)."""
    message = email.parser.Parser().parsestr(wheel_metadata(wheel, "METADATA"))
    return [Requirement(line) for line in message.get_all("Requires-Dist") or []]


def wanted(requirement: Requirement, extras: set[str]) -> bool:
    """Whether a requirement applies to an install with these extras (and this Python)."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in {"", *extras})


def dependency_closure(
    wheel: Path, extras: frozenset[str] = frozenset()
) -> list[metadata.Distribution]:
    """The distributions of this venv that an install of the wheel with `extras` needs (none:
    the light install, whose Spark is the Connect client only).

    Raises AssertionError when this venv lacks one or holds a version the wheel does not accept.
    """
    found: dict[str, metadata.Distribution] = {}
    extras_of: dict[str, set[str]] = {}
    own = canonicalize_name(
        email.parser.Parser().parsestr(wheel_metadata(wheel, "METADATA"))["Name"]
    )
    pending = [r for r in requirements_of(wheel) if wanted(r, set(extras))]
    # An extra of the project naming others of its own (`cdc-lakehouse[spark]`): theirs too.
    while any(canonicalize_name(r.name) == own for r in pending):
        for requirement in [r for r in pending if canonicalize_name(r.name) == own]:
            pending.remove(requirement)
            more = set(requirement.extras) - set(extras)
            extras = extras | more
            pending += [r for r in requirements_of(wheel) if wanted(r, more) and r not in pending]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        try:
            distribution = found.get(name) or metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            raise AssertionError(f"{requirement}: not installed in {sys.prefix}") from None
        assert requirement.specifier.contains(distribution.version, prereleases=True), (
            f"{requirement}: {sys.prefix} has {distribution.version}"
        )
        new_extras = set(requirement.extras) - extras_of.get(name, set())
        if name in found and not new_extras:
            continue
        found[name] = distribution
        extras = extras_of.setdefault(name, set())
        extras |= new_extras
        pending += [r for r in map(Requirement, distribution.requires or []) if wanted(r, extras)]
    return list(found.values())


def target_exists(path: Path) -> bool:
    """Whether a file is already at `path` (linked by another distribution)."""
    return path.exists() or path.is_symlink()


def link_distribution(distribution: metadata.Distribution, venv: Path) -> int:
    """Hard-link one distribution's installed files into `venv` (console scripts rewritten for
    its Python); the number of files."""
    prefix = Path(sys.prefix)
    count = 0
    for file in distribution.files or []:
        source = Path(str(distribution.locate_file(file)))
        relative = Path(os.path.relpath(source, prefix))
        # pyspark and pyspark-client install the same pyspark/ files: the first one links them.
        if relative.parts[0] == ".." or not source.is_file() or target_exists(venv / relative):
            continue
        target = venv / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if relative.parts[0] == "bin" and source.read_bytes()[:2] == b"#!":
            text = source.read_text()
            target.write_text(text.replace(str(prefix / "bin"), str(venv / "bin")))
            target.chmod(source.stat().st_mode)
        else:
            os.link(source, target)
        count += 1
    return count


def make_venv(
    venv: Path,
    wheel: Path,
    mode: str,
    extras: frozenset[str] = frozenset(),
    constraints: Path | None = None,
) -> None:
    """A fresh venv of this Python with the wheel, with `extras`, and its dependencies (see the
    module doc); `index` installs them under `constraints` (default: `make install`'s, i.e.
    docker/constraints.txt)."""
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python]
    if mode == "index":
        constraints = constraints or REPO / ".venv" / "constraints.txt"
        run(
            [
                *pip,
                "install",
                "--quiet",
                "--no-compile",
                "--constraint",
                str(constraints),
                f"{wheel}[{','.join(sorted(extras))}]" if extras else str(wheel),
            ]
        )
    else:
        assert mode == "linked", f"CDC_TEST_WHEEL_DEPS={mode}: linked or index"
        for distribution in dependency_closure(wheel, extras):
            link_distribution(distribution, venv)
        run([*pip, "install", "--quiet", "--no-deps", "--no-index", str(wheel)])
    run([*pip, "check"])


def run(
    command: list[str],
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run a command; fail with its output when it exits non-zero."""
    result = subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, (
        f"{' '.join(command)} exited {result.returncode}\n{result.stdout[-4000:]}\n"
        f"{result.stderr[-4000:]}"
    )
    return result


def clean_environment(venv: Path, home: Path) -> dict[str, str]:
    """This machine's environment without any Python, Airflow, Spark or CDC setting of this
    venv or the test run; the new venv first on PATH, Airflow's home in `home`."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AIRFLOW", "CDC_", "SPARK_", "PYSPARK", "PYTHON", "VIRTUAL_ENV"))
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["AIRFLOW_HOME"] = str(home)
    env["CDC_SHUFFLE_PARTITIONS"] = "2"
    return env
