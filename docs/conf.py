"""Sphinx configuration for the maxent-grpo documentation.

Build:  make docs   (sphinx -W --keep-going -n -b html docs docs/_build/html)

The build is nitpicky and treats warnings as errors. It needs no network and no GPU:
- The recipe-key and CLI references are generated from the code at build time by the
  local extension docs/_ext/maxent_reference.py (into docs/reference/generated/, gitignored).
- intersphinx is deliberately NOT used: it downloads inventories (objects.inv) at build time,
  and our build machines have no network. References to types of other projects (the Python
  standard library, torch, transformers, TRL, datasets, ...) therefore cannot resolve, and
  nitpick_ignore_regex below lists them by module prefix. Any unresolved reference to our
  own package (maxent_grpo.*) is still an error.
- autodoc imports the package, which imports torch, transformers, TRL and datasets (package
  dependencies, installed on Read the Docs too). vLLM and DeepSpeed (the GPU-stack extras)
  are never imported by the build, even where they are installed: see _BLOCKED below.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(ROOT / "src"))  # also works without `pip install -e .`

# vLLM and DeepSpeed are hidden from the build: with None in sys.modules, `import vllm` fails
# and importlib.util.find_spec("vllm") returns None, so TRL, transformers and accelerate see
# them as not installed, as on Read the Docs (the docs extra does not install them). No module
# of maxent_grpo imports them at import time. autodoc_mock_imports is not an option here: a
# mocked vllm has a module spec but no version, and TRL's is_vllm_available() then fails
# with "Invalid version: ''" while autodoc imports a module that uses trl.GRPOTrainer.
_BLOCKED = ("vllm", "deepspeed")
for _name in _BLOCKED:
    sys.modules[_name] = None  # type: ignore[assignment]

# Importing the package must not grab a GPU or start threads we do not need.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import maxent_reference  # noqa: E402  (docs/_ext)

import maxent_grpo  # noqa: E402

project = "maxent-grpo"
author = "maxent-grpo contributors"
copyright = "maxent-grpo contributors"  # noqa: A001
release = maxent_grpo.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "maxent_reference",  # docs/_ext: generates reference/generated/*.rst
    "migration_reference",  # docs/_ext: the open-r1 key tables (coming-from-open-r1.md)
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# reference/generated/*.rst are included into reference/*.rst, not documents of their own.
exclude_patterns = ["_build", "reference/generated", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []

nitpicky = True
# Types of other projects: resolvable only through intersphinx, which needs the network
# (see the module docstring). Everything else must resolve.
nitpick_ignore_regex = [
    # Python standard library
    (
        r"py:.*",
        r"(argparse|ast|collections|contextlib|dataclasses|enum|os|pathlib|re|signal|"
        r"socket|subprocess|threading|types|typing|json|logging)(\..*)?",
    ),
    (
        r"py:.*",
        r"(Path|PathLike|Any|Callable|Mapping|Sequence|Iterable|Iterator|ModuleType|"
        r"Namespace|ArgumentParser|Action|Popen|Field)",
    ),
    # Third-party libraries without a local inventory
    (
        r"py:.*",
        r"(torch|transformers|trl|datasets|accelerate|math_verify|"
        r"latex2sympy2_extended|yaml|submitit|vllm|deepspeed|requests|urllib3)(\..*)?",
    ),
    (r"py:.*", r"(TrlParser|ModelConfig|TrainerCallback|Dataset|DatasetDict|Tensor)"),
    # Private base classes of ours, shown by show-inheritance but not documented by design.
    (r"py:class", r"maxent_grpo(\.\w+)*\._\w+"),
]

# MyST (Markdown pages)
myst_enable_extensions = ["amsmath", "dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# autodoc (nothing is mocked: see _BLOCKED above for vLLM and DeepSpeed)
autodoc_mock_imports: list[str] = []
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Docstrings write `x` for code, as in Markdown.
default_role = "literal"
# Object entries (every function, every recipe key) would swamp the page tables of contents.
toc_object_entries = False


def _signature(app, what, name, obj, options, signature, return_annotation):
    """Class signatures: none for TRL config subclasses, evaluated types for dataclasses."""
    if what != "class" or not isinstance(obj, type) or not dataclasses.is_dataclass(obj):
        return None
    from transformers import TrainingArguments

    if issubclass(obj, TrainingArguments):
        # ~200 keyword arguments: the recipe keys, documented on the recipe-key page.
        return ("", return_annotation)
    return (maxent_reference.dataclass_signature(obj), return_annotation)


_LIST_ITEM = re.compile(r"^\s*(- |\* |\d+\. )")


def _markdown_lists(app, what, name, obj, options, lines):
    """Docstrings here are written like Markdown: a "- " list may follow a paragraph line
    directly. reST needs a blank line there, so one is inserted (nothing else is changed)."""
    i = 1
    while i < len(lines):
        previous = lines[i - 1]
        if (
            _LIST_ITEM.match(lines[i])
            and previous.strip()
            and not _LIST_ITEM.match(previous)
            and len(previous) - len(previous.lstrip()) == len(lines[i]) - len(lines[i].lstrip())
        ):
            lines.insert(i, "")
            i += 1
        i += 1


_LITERAL_SPAN = re.compile(r"``.+?``|`[^`]+`")
_EMPHASIS = re.compile(r"(?<![\w\\*])(\*\*?)(?=\S)(.+?)(?<=\S)\1(?![\w*])")


def _escape_stray_asterisks_in(text: str) -> str:
    kept = []  # emphasis pairs stay markup; every other "*" becomes a literal asterisk

    def keep(match):
        kept.append(match.group(0))
        return f"\x00{len(kept) - 1}\x00"

    text = _EMPHASIS.sub(keep, text)
    text = re.sub(r"(?<!\\)\*", r"\\*", text)
    return re.sub("\x00(\\d+)\x00", lambda m: kept[int(m.group(1))], text)


def _stray_asterisks(app, what, name, obj, options, lines):
    """Docstrings here are written like Markdown: `*_train.log` or `*args` in running text is
    not the start of an emphasis. Such lone asterisks are escaped; `code`, ``literals``,
    literal blocks (after "::"), doctests and real *emphasis* pairs are left alone."""
    literal_indent = None
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if not stripped or indent > literal_indent:
                continue
            literal_indent = None
        if "*" in line and not stripped.startswith((">>>", "...", ".. ")):
            parts = _LITERAL_SPAN.split(line)
            spans = _LITERAL_SPAN.findall(line)
            fixed = [_escape_stray_asterisks_in(part) for part in parts]
            lines[i] = "".join(
                p + (spans[j] if j < len(spans) else "") for j, p in enumerate(fixed)
            )
        if stripped.endswith("::"):
            literal_indent = indent


def setup(app):
    app.connect("autodoc-process-signature", _signature)
    app.connect("autodoc-process-docstring", _markdown_lists)
    app.connect("autodoc-process-docstring", _stray_asterisks)


# HTML
html_theme = "furo"
html_title = f"maxent-grpo {release}"
html_static_path: list[str] = []
html_show_sourcelink = True
