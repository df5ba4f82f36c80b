"""Generate the recipe-key and CLI reference pages from the code, at Sphinx build time.

Nothing here is copied by hand: the recipe keys come from their declarations
(``maxent_grpo.recipe.declare``): the dataclasses the recipe parser uses (each method's
sections in ``maxent_grpo.recipe.sections.SECTIONS``: ``recipe.keys.GRPO_TYPES``,
``recipe.maxent_keys.MAXENT_TYPES``) through ``dataclasses.fields()`` and ``metadata["help"]``, each
key's range and packages (``recipe.schema.key_declarations``) and the old keys migrated to it
(``migrate.MIGRATIONS``); the set of keys is the set of flags the recipe parser
builds from those dataclasses
(``maxent_grpo.recipe.schema.trl_parser``; ``read_recipe`` reads the same flags from the
committed ``recipe/schema.json``, kept equal by a test), i.e. exactly what it accepts.
The CLI page comes from ``maxent_grpo.cli.build_parser()``.

Help texts from TRL and transformers are written in Markdown / HF doc-builder syntax; they are
rendered as literal text: only `code` spans and links are kept, every other ASCII punctuation
character is backslash-escaped, so no help text can create markup or a cross-reference.

The module imports no Sphinx at import time, so tests can call the generators directly::

    import maxent_reference
    text = maxent_reference.render_recipe_keys()

Sphinx calls :func:`setup`, which writes ``docs/reference/generated/*.rst`` on
``builder-inited`` (before sources are read). Those files are included by
``docs/reference/recipe-keys.md`` and ``docs/reference/cli.md`` and are gitignored.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import inspect
import os
import re
import string
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GENERATED_DIR = Path(__file__).resolve().parents[1] / "reference" / "generated"
RECIPE_KEYS_FILE = "recipe-keys.rst"
CLI_FILE = "cli.rst"
API_FILE = "api.rst"
PACKAGE = "maxent_grpo"

# Where a declaring class is documented, shown next to each section title.
_SOURCE_NOTES = {
    "maxent_grpo": "this project",
    "trl": "TRL",
    "transformers": "transformers",
}

# --------------------------------------------------------------------------------------------
# reStructuredText escaping
# --------------------------------------------------------------------------------------------

_PUNCT = set(string.punctuation)
# HF doc-builder cross reference: [`~transformers.TrainingArguments`] or [`GRPOTrainer`].
_HF_XREF = re.compile(r"\[`~?([^`\]]+)`\]")
# Markdown link: [text](http...).
_MD_LINK = re.compile(r"\[([^\]]+)\]\((https?://(?:[^()\s]|\([^()\s]*\))+)\)")
_BARE_URL = re.compile(r"https?://[^\s<>`'\"\])]+")
_CODE = re.compile(r"``([^`]+)``|`([^`]+)`")


def escape(text: str) -> str:
    """Plain text for an rST paragraph: every ASCII punctuation character is escaped."""
    return "".join("\\" + ch if ch in _PUNCT else ch for ch in text)


def literal(text: str) -> str:
    """An inline literal, or escaped text when the content cannot be one."""
    text = " ".join(str(text).split())
    if not text or "``" in text or text.startswith("`") or text.endswith("`") or "\\" in text:
        return escape(text)
    return f"``{text}``"


def _link(text: str, url: str) -> str:
    label = " ".join(text.replace("`", "").replace("<", "").replace(">", "").split())
    label = label.replace("\\", "")
    if not label:
        return f"`<{url}>`__"
    return f"`{label} <{url}>`__"


def inline(text: str) -> str:
    """Help text from any library as one safe rST paragraph line.

    Kept: `code` spans (as literals) and http(s) links; everything else is literal text.
    Inline markup is separated from its neighbours with escaped spaces (``\\ ``), which
    rST removes, so it is recognised wherever it sits.
    """
    text = " ".join(str(text).split())
    pieces: list[tuple[str, str]] = []  # (kind, rendered); kind "text" or "markup"

    def plain(chunk: str) -> None:
        # Bare URLs become links, the rest is escaped.
        pos = 0
        for match in _BARE_URL.finditer(chunk):
            url = match.group(0).rstrip(".,;:!?")
            end = match.start() + len(url)
            if match.start() > pos:
                pieces.append(("text", escape(chunk[pos : match.start()])))
            pieces.append(("markup", f"`<{url}>`__"))
            pos = end
        if pos < len(chunk):
            pieces.append(("text", escape(chunk[pos:])))

    def code_and_plain(chunk: str) -> None:
        pos = 0
        for match in _CODE.finditer(chunk):
            if match.start() > pos:
                plain(chunk[pos : match.start()])
            content = match.group(1) or match.group(2)
            rendered = literal(content)
            pieces.append(("markup" if rendered.startswith("``") else "text", rendered))
            pos = match.end()
        if pos < len(chunk):
            plain(chunk[pos:])

    text = _HF_XREF.sub(lambda m: f"`{m.group(1)}`", text)
    pos = 0
    for match in _MD_LINK.finditer(text):
        if match.start() > pos:
            code_and_plain(text[pos : match.start()])
        pieces.append(("markup", _link(match.group(1), match.group(2))))
        pos = match.end()
    if pos < len(text):
        code_and_plain(text[pos:])

    out = ""
    previous = None
    for kind, rendered in pieces:
        if out and (kind == "markup" or previous == "markup"):
            if not out[-1].isspace() and not rendered[:1].isspace():
                out += "\\ "
        out += rendered
        previous = kind
    return out


# --------------------------------------------------------------------------------------------
# Types and defaults
# --------------------------------------------------------------------------------------------


def type_name(hint: Any, qualified: bool = False) -> str:
    """`str | None`, `list[str]`, `SchedulerType | str`: short, Python-like.

    qualified: name non-builtin classes by module path (for signatures that Sphinx links).
    """
    if isinstance(hint, str):
        return hint
    if hint is type(None) or hint is None:
        return "None"
    if hint is Ellipsis:
        return "..."
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a, qualified) for a in args]
        # None last, as people write it.
        names = [n for n in names if n != "None"] + (["None"] if "None" in names else [])
        return " | ".join(names)
    if origin is typing.Literal:
        return "Literal[" + ", ".join(repr(a) for a in args) + "]"
    if origin is not None:
        base = getattr(origin, "__name__", str(origin))
        if qualified and getattr(origin, "__module__", "builtins") != "builtins":
            base = f"{origin.__module__}.{base}"
        if args:
            return f"{base}[{', '.join(type_name(a, qualified) for a in args)}]"
        return base
    if hint is typing.Any:
        return "typing.Any" if qualified else "Any"
    if isinstance(hint, type):
        if qualified and hint.__module__ != "builtins":
            return f"{hint.__module__}.{hint.__qualname__}"
        return hint.__name__
    return str(hint).replace("typing.", "")


def dataclass_signature(cls: type) -> str:
    """`(name: type = default, ...)` of a dataclass, with its annotations evaluated.

    autodoc shows a dataclass's generated __init__ with string annotations (quoted, and not
    linkable) when its module uses `from __future__ import annotations`.
    """
    try:
        hints = typing.get_type_hints(cls)
    except NameError:
        # Sections named only under TYPE_CHECKING (recipe.Recipe: importing them imports TRL).
        import maxent_grpo.recipe.keys as keys

        hints = typing.get_type_hints(cls, localns=vars(keys))
    params = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        param = f"{f.name}: {type_name(hints.get(f.name, f.type), qualified=True)}"
        default = _default_of(f)
        if default is not dataclasses.MISSING:
            param += f" = {default!r}"
        params.append(param)
    return "(" + ", ".join(params) + ")"


def _enum_types(hint: Any) -> list[type[enum.Enum]]:
    candidates = typing.get_args(hint) or (hint,)
    return [a for a in candidates if isinstance(a, type) and issubclass(a, enum.Enum)]


def yaml_value(value: Any) -> str:
    """A default as it would be written in a recipe."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if value == "" or value.strip() != value else value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


# --------------------------------------------------------------------------------------------
# Recipe keys
# --------------------------------------------------------------------------------------------


@dataclass
class RecipeKey:
    name: str
    owner: type  # the class that declares the field (most derived one)
    type: str
    default: str | None  # None: required
    help: str
    choices: tuple[str, ...] = ()
    range: str = ""  # its declared range in words ("> 0 and <= 1"), or ""
    packages: tuple[Any, ...] = ()  # recipe.declare.Package: what a value of it needs
    replaces: tuple[Any, ...] = ()  # migrate.kinds.Migration: old keys migrated to it
    methods: set[str] = field(default_factory=set)
    overrides: list[type] = field(default_factory=list)  # base classes that declare it too


def declaring_class(cls: type, name: str) -> type:
    """The first class in cls's MRO whose own annotations declare `name`."""
    for klass in cls.__mro__:
        if name in inspect.get_annotations(klass):
            return klass
    return cls


def _parser_actions(types_: tuple[type, ...]) -> dict[str, argparse.Action]:
    """dest -> action of the parser the recipe loader builds (TRL's, from the dataclasses)."""
    from maxent_grpo.recipe.schema import trl_parser

    actions: dict[str, argparse.Action] = {}
    for action in trl_parser(types_)._actions:
        if action.dest == "help":
            continue
        # store_false actions (--no_x) share the dest; keep the one with a type
        if action.dest not in actions or action.type is not None:
            actions[action.dest] = action
    return actions


def recipe_type_sets() -> dict[str, tuple[type, ...]]:
    """{method: dataclass types} for every method of the registry."""
    from maxent_grpo.recipe.sections import SECTIONS

    return {name: tuple(types) for name, types in SECTIONS.items()}


def _declared() -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """Each key's declaration (range, packages; recipe/declare.py) and the old keys migrated
    to it (migrate/)."""
    from maxent_grpo.migrate import MIGRATIONS
    from maxent_grpo.recipe.schema import key_declarations

    replaces: dict[str, list[Any]] = {}
    for old in MIGRATIONS.values():
        if old.target:
            replaces.setdefault(old.target, []).append(old)
    return key_declarations(), replaces


def collect_recipe_keys() -> list[RecipeKey]:
    """Every key any method's recipe parser accepts, with its declaring class and help."""
    from maxent_grpo.recipe.declare import describe

    declared, replaces = _declared()
    keys: dict[str, RecipeKey] = {}
    for method, types_ in recipe_type_sets().items():
        actions = _parser_actions(types_)
        for cls in types_:
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                if f.name not in actions:
                    continue  # init=False fields: not settable from a recipe
                if f.name in keys:
                    keys[f.name].methods.add(method)
                    continue
                owner = declaring_class(cls, f.name)
                action = actions[f.name]
                hint = hints.get(f.name, f.type)
                choices: tuple[str, ...] = ()
                if action.choices:
                    choices = tuple(str(c) for c in action.choices)
                elif _enum_types(hint):
                    choices = tuple(str(m.value) for e in _enum_types(hint) for m in e)
                default = _default_of(f)
                accepts = declared.get(f.name)
                overrides = [
                    k
                    for k in owner.__mro__[1:]
                    if f.name in inspect.get_annotations(k) and dataclasses.is_dataclass(k)
                ]
                keys[f.name] = RecipeKey(
                    name=f.name,
                    owner=owner,
                    type=type_name(hint),
                    default=None if default is dataclasses.MISSING else yaml_value(default),
                    help=str(f.metadata.get("help", "") or ""),
                    choices=choices,
                    range=describe(accepts.range) if accepts and accepts.range else "",
                    packages=accepts.packages if accepts else (),
                    replaces=tuple(replaces.get(f.name, ())),
                    methods={method},
                    overrides=overrides[:1],
                )
    return list(keys.values())


def class_path(cls: type) -> str:
    """Public import path: trl.GRPOConfig rather than trl.trainer.grpo_config.GRPOConfig."""
    top = cls.__module__.split(".")[0]
    try:
        if getattr(importlib.import_module(top), cls.__name__, None) is cls:
            return f"{top}.{cls.__name__}"
    except ImportError:
        pass
    return f"{cls.__module__}.{cls.__qualname__}"


def _section_order(cls: type) -> tuple[int, str]:
    top = cls.__module__.split(".")[0]
    rank = {"maxent_grpo": 0, "trl": 1, "transformers": 2}.get(top, 3)
    return (rank, cls.__module__)


def _first_doc_line(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    for line in doc.splitlines():
        if line.strip():
            return line.strip()
    return ""


# Top-level keys that are not dataclass fields (read by maxent_grpo.recipe.parser).
SPECIAL_KEYS = {
    "env": (
        "dict[str, str]",
        "{}",
        "A mapping of environment variables (values converted to strings) for the run's "
        "processes, e.g. `env: {WANDB_MODE: offline}`: the launcher puts them into the "
        "environment of the trainers and the vLLM server; `python src/grpo.py` alone exports "
        "them when it starts. `check` and `plan` never export them.",
    ),
    "method": (
        "str",
        "grpo",
        "The training method, `grpo` or `maxent`: which keys the recipe may use and which "
        "trainer runs it. `--method` (or `MAXENT=1 bash training.sh`) may ask for the same "
        "method; asking for another one is an error.",
    ),
}


def _confval(key: str, type_: str, default: str | None, body: list[str]) -> list[str]:
    """A confval directive; default None means the key is required.

    Type and default go on one line (confval's :type:/:default: options take four lines).
    """
    shown = literal(default) if default is not None else "required"
    lines = [f".. confval:: {key}", ""]
    lines += [f"   *Type* {literal(type_)}, *default* {shown}", ""]
    for paragraph in body:
        lines += ["   " + paragraph, ""]
    return lines


def render_recipe_keys(keys: list[RecipeKey] | None = None) -> str:
    """The recipe-key reference as reStructuredText (included by reference/recipe-keys.md)."""
    keys = collect_recipe_keys() if keys is None else keys
    methods = sorted({m for k in keys for m in k.methods})
    by_owner: dict[type, list[RecipeKey]] = {}
    for key in keys:
        by_owner.setdefault(key.owner, []).append(key)
    owners = sorted(by_owner, key=_section_order)

    out = [
        ".. This file is generated by docs/_ext/maxent_reference.py at build time. Do not edit.",
        "",
        f"{len(keys) + 1} keys for the methods: {', '.join(methods)}.",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "",
        "   * - Declared by",
        "     - Keys",
    ]
    for owner in owners:
        out += [f"   * - :ref:`{class_path(owner)} <recipe-keys-{_slug(owner)}>`"]
        out += [f"     - {len(by_owner[owner])}"]
    out += ["   * - :ref:`special keys <recipe-keys-special>`", "     - 1", ""]

    for owner in owners:
        path = class_path(owner)
        top = owner.__module__.split(".")[0]
        title = f"{path} ({_SOURCE_NOTES.get(top, top)})"
        out += [f".. _recipe-keys-{_slug(owner)}:", "", escape(title), "-" * len(escape(title)), ""]
        summary = _first_doc_line(owner)
        if summary:
            out += [inline(summary), ""]
        for key in by_owner[owner]:
            body = [inline(key.help) if key.help else "No help text."]
            if key.choices:
                body.append("Choices: " + ", ".join(literal(c) for c in key.choices) + ".")
            if key.range:
                body.append(f"Range: {literal(key.range)}.")
            for p in key.packages:
                need = f"{literal(p.module)} (extra {literal(p.extra)})"
                body.append(f"Needs {need} when {inline(p.when)}.")
            if key.replaces:
                old = ", ".join(f"{literal(m.key)} ({escape(m.origin)})" for m in key.replaces)
                body.append(f"Replaces {old}.")
            if key.overrides:
                base = class_path(key.overrides[0])
                body.append(f"Redeclares the field of {literal(base)} (default or help differ).")
            if set(methods) - key.methods:
                only = ", ".join(sorted(key.methods))
                body.append(f"Only accepted with ``method: {only}``.")
            out += _confval(key.name, key.type, key.default, body)

    title = "Special keys"
    out += [".. _recipe-keys-special:", "", title, "-" * len(title), ""]
    for key, (type_, default, text) in SPECIAL_KEYS.items():
        out += _confval(key, type_, default, [inline(text)])
    return "\n".join(out).rstrip() + "\n"


def _slug(cls: type) -> str:
    return re.sub(r"[^a-z0-9]+", "-", class_path(cls).lower()).strip("-")


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name, ""), sub))
    return out


def cli_subcommands() -> list[str]:
    """Names of the `maxent-grpo` subcommands, in parser order."""
    from maxent_grpo.cli import build_parser

    return [name for name, _, _ in _subcommands(build_parser())]


def _option_signature(action: argparse.Action) -> str:
    if not action.option_strings:
        metavar = action.metavar or action.dest
        return f"{metavar} ..." if action.nargs == argparse.REMAINDER else metavar
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return names
    if action.choices:
        return f"{names} {{{','.join(str(c) for c in action.choices)}}}"
    metavar = action.metavar or action.dest.upper()
    return f"{names} <{metavar}>"


def _sentence(text: str) -> str:
    """Capitalised, ending with a full stop."""
    text = " ".join(text.split())
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def _usage(parser: argparse.ArgumentParser) -> list[str]:
    # argparse wraps usage at the terminal width ($COLUMNS): fix it, for the same page anywhere.
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        usage = parser.format_usage().strip()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    usage = usage[len("usage: ") :] if usage.startswith("usage: ") else usage
    return [".. code-block:: text", ""] + ["   " + line for line in usage.splitlines()] + [""]


def _options(parser: argparse.ArgumentParser, program: str) -> list[str]:
    out = [f".. program:: {program}", ""]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        out += [f".. option:: {_option_signature(action)}", ""]
        # As `--help` shows it: argparse expands %(default)s and %% in help strings.
        help_ = parser._get_formatter()._expand_help(action) if action.help else ""
        help_ = _sentence(help_)
        text = inline(help_) if help_ else "No help text."
        details = []
        if action.required and action.option_strings:
            details.append("Required.")
        elif (
            action.option_strings
            and action.default not in (None, argparse.SUPPRESS)
            and "default" not in help_.lower()
        ):
            details.append(f"Default: {literal(str(action.default))}.")
        if action.choices:
            details.append("Choices: " + ", ".join(literal(str(c)) for c in action.choices) + ".")
        out += ["   " + " ".join([text, *details]), ""]
    return out


def render_cli() -> str:
    """The `maxent-grpo` CLI reference as reStructuredText (included by reference/cli.md)."""
    from maxent_grpo.cli import build_parser

    parser = build_parser()
    prog = parser.prog
    out = [
        ".. This file is generated by docs/_ext/maxent_reference.py at build time. Do not edit.",
        "",
    ]
    if parser.description:
        out += [inline(parser.description), ""]
    out += _usage(parser)
    subs = _subcommands(parser)
    out += [".. list-table::", "   :header-rows: 1", "", "   * - Subcommand", "     - Purpose"]
    for name, help_, _ in subs:
        out += [f"   * - :ref:`{name} <cli-{name}>`", f"     - {inline(help_)}"]
    out.append("")
    for name, help_, sub in subs:
        title = f"{prog} {name}"
        out += [f".. _cli-{name}:", "", escape(title), "-" * len(escape(title)), ""]
        if help_:
            out += [inline(_sentence(help_)), ""]
        out += _usage(sub)
        out += _options(sub, title)
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# API module list
# --------------------------------------------------------------------------------------------


def package_modules(package: str = PACKAGE) -> list[str]:
    """Every module of the package, found on disk (nothing is imported here)."""
    import pkgutil

    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            names.append(info.name)
    return sorted(names)


def render_api(modules: list[str] | None = None) -> str:
    """One autodoc section per module of the package (included by reference/api.md)."""
    modules = package_modules() if modules is None else modules
    out = [
        ".. This file is generated by docs/_ext/maxent_reference.py at build time. Do not edit.",
        "",
    ]
    for name in modules:
        out += [escape(name), "-" * len(escape(name)), "", f".. automodule:: {name}", ""]
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# Writing and Sphinx glue
# --------------------------------------------------------------------------------------------


def _write_if_changed(path: Path, text: str) -> bool:
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: a concurrent build never reads half a file
    return True


def generate(out_dir: str | Path = GENERATED_DIR) -> list[Path]:
    """Write every generated page into out_dir; unchanged files are left untouched."""
    out = Path(out_dir)
    files = {
        RECIPE_KEYS_FILE: render_recipe_keys(),
        CLI_FILE: render_cli(),
        API_FILE: render_api(),
    }
    for name, text in files.items():
        _write_if_changed(out / name, text)
    return [out / name for name in files]


def documented_keys(text: str) -> set[str]:
    """Keys documented in a rendered recipe-key page."""
    return set(re.findall(r"^\.\. confval:: (\S+)$", text, flags=re.MULTILINE))


def documented_programs(text: str) -> set[str]:
    """Programs (``maxent-grpo run`` ...) documented in a rendered CLI page."""
    return set(re.findall(r"^\.\. program:: (.+)$", text, flags=re.MULTILINE))


def _on_builder_inited(app: Any) -> None:
    generate(Path(app.srcdir) / "reference" / "generated")


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


__all__: Iterable[str] = [
    "collect_recipe_keys",
    "cli_subcommands",
    "documented_keys",
    "documented_programs",
    "generate",
    "package_modules",
    "render_api",
    "render_cli",
    "render_recipe_keys",
]
