"""What the GPU kit carries: the wheels the lent GPU machine lacks, and nothing it has.

    python bench/gpu_kit/packages.py list            # NAME==VERSION, one a line (to download)
    python bench/gpu_kit/packages.py check DIR       # every need of DIR's wheels is met
    python bench/gpu_kit/packages.py conflicts DIR   # needs the installed versions break
    python bench/gpu_kit/packages.py missing DIR     # NAME==VERSION not yet in DIR
    python bench/gpu_kit/packages.py stale DIR       # wheels in DIR the kit does not carry

The machine (docs/performance.md, "GPU"): Python 3.12 with PyTorch 2.11 (CUDA 13),
transformers 5.17, accelerate 1.15, peft and the packages in MACHINE_HAS (its image's package
list, as read there in 2026-11). The pins of what we need come from pyproject.toml (one source
of truth); the versions of their own needs are the ones our .venv resolved together.

Why `check` reads the wheels' metadata instead of `pip install --dry-run --target`: with
--target pip ignores every installed package and re-resolves torch, transformers and CUDA's
libraries for the target (gigabytes to fetch); the metadata check is offline and exact about
names. Versions of what the machine has are checked there, at run time (`conflicts`).
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What our pyproject pins and the machine lacks (the rest of our pins it has, or we do not
# need on it: torch, transformers, accelerate, pyyaml, matplotlib; wandb and submitit: a run
# with report_to none and no Slurm imports neither; vllm: over 300 MB, cannot travel).
FROM_PYPROJECT = ("trl", "datasets", "math-verify", "deepspeed")
# Their needs the machine lacks, at the versions our .venv resolved (dill < 0.4.2 for datasets).
NEEDS = {
    "dill": "0.4.1",
    "multiprocess": "0.70.19",
    "latex2sympy2-extended": "1.11.0",
    "antlr4-python3-runtime": "4.13.2",
    "hjson": "3.1.0",
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
}
# Built here from its source (no ops: DS_BUILD_OPS=0); every other one is a wheel on PyPI.
BUILT = ("deepspeed",)
MACHINE_HAS = frozenset(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
    lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
    ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
    nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
    pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
    psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
    pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
    pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
    scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
    shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
    tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
    torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
    treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
    wheel wrapt xarray xxhash yarl zipp""".split()
)
# The machine's interpreter, for evaluating environment markers (python_version < "3.13"...).
MARKER_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_pins(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """name -> version of every `name==version` in pyproject.toml (dependencies and extras)."""
    text = pyproject.read_text()
    return {normalise(n): v for n, v in re.findall(r'"([A-Za-z0-9_.-]+)==([^"; ]+)"', text)}


def kit(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """Every package the kit carries: name -> version."""
    pins = pyproject_pins(pyproject)
    missing = [name for name in FROM_PYPROJECT if name not in pins]
    if missing:
        raise SystemExit(f"pyproject.toml pins none of: {', '.join(missing)}")
    wanted = {name: pins[name] for name in FROM_PYPROJECT}
    wanted.update(NEEDS)
    carried_but_present = sorted(set(wanted) & MACHINE_HAS)
    if carried_but_present:
        raise SystemExit(f"the machine already has: {', '.join(carried_but_present)}")
    return wanted


def wheel_name(path: Path) -> str:
    return normalise(path.name.split("-")[0])


def requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines that apply on the machine (no extras)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    found = []
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(MARKER_ENV):
                found.append(str(req))
    return found


def unmet(wheels: list[Path]) -> list[str]:
    """Needs of the wheels that neither the kit nor the machine meets, as 'wheel: need'."""
    from packaging.requirements import Requirement

    carried = {wheel_name(w) for w in wheels}
    problems = []
    for wheel in wheels:
        for line in requirements(wheel):
            name = normalise(Requirement(line).name)
            if name not in carried and name not in MACHINE_HAS:
                problems.append(f"{wheel.name}: {line}")
    return problems


def conflicts(wheels: list[Path]) -> list[str]:
    """Needs of the wheels whose installed version (here, at run time) is out of range."""
    from importlib import metadata

    from packaging.requirements import Requirement

    found = []
    for wheel in wheels:
        for line in requirements(wheel):
            req = Requirement(line)
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                found.append(f"{wheel_name(wheel)} needs {line}: not installed")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                found.append(f"{wheel_name(wheel)} needs {line}: {have} installed")
    return found


def wheel_version(path: Path) -> str:
    return path.name.split("-")[1]


def missing(folder: Path) -> list[str]:
    """NAME==VERSION of the kit's packages that have no wheel in folder yet."""
    have = {(wheel_name(w), wheel_version(w)) for w in folder.glob("*.whl")}
    return [f"{n}=={v}" for n, v in kit().items() if (n, v) not in have]


def stale(folder: Path) -> list[Path]:
    """Wheels in folder that the kit does not carry (another version, a dropped package)."""
    wanted = kit()
    return [
        w for w in sorted(folder.glob("*.whl")) if wanted.get(wheel_name(w)) != wheel_version(w)
    ]


def main(argv: list[str]) -> int:
    if argv[:1] == ["list"]:
        for name, version in kit().items():
            print(f"{name}=={version}")
        return 0
    if len(argv) == 2 and argv[0] in ("missing", "stale"):
        found = missing(Path(argv[1])) if argv[0] == "missing" else stale(Path(argv[1]))
        for item in found:
            print(item)
        return 0
    if len(argv) == 2 and argv[0] in ("check", "conflicts"):
        wheels = sorted(Path(argv[1]).glob("*.whl"))
        names = {wheel_name(w) for w in wheels}
        if argv[0] == "conflicts":
            problems = conflicts(wheels)
        else:
            problems = unmet(wheels) + [f"missing wheel: {n}" for n in sorted(set(kit()) - names)]
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
