"""Every public name of robust_stan has a numpydoc docstring whose sections match its signature.

"Public" means, and this test enumerates exactly these:

1. every name in ``robust_stan.__all__``: its functions, its classes, and for its other objects
   (``FAMILIES``, ``COMPILE_COUNTS``) the package's own classes of the object and of its values
   (the family record);
2. every public method and property (no leading underscore, defined in robust_stan, inherited
   ones included) of each class in 1;
3. every class of robust_stan that a return annotation of a function or method in 1 or 2 names
   (``Model.sample -> Fit``, ``Model.oracle_for -> GradientOracle``, ...), with its public methods
   and properties, repeated until no new class turns up;
4. every function or class that ``README.md`` or a page of ``docs/`` tells users to call as
   ``robust_stan.<module>.<name>``.

For each function or method (an inherited one is checked once, where it is defined): the
docstring has a summary; a ``Parameters`` section naming exactly the signature's parameters
(``self`` and ``cls`` excepted; ``*args`` and ``**kwargs`` by those names) when it has any; a
``Returns`` or ``Yields`` section when it is annotated to return something other than None, or
is unannotated and has a ``return <value>``. A class documents its constructor's parameters in
its own docstring the same way (a constructor inherited from outside robust_stan, as an
exception's, has none to document). A property needs a summary. numpydoc's own parser
(``numpydoc.docscrape``, as the docs site reads them) parses every docstring, and its warnings
(an unknown section, say) count as faults.
"""

import ast
import inspect
import re
import textwrap
import typing
import warnings
from pathlib import Path

from numpydoc.docscrape import NumpyDocString

import robust_stan as rs

ROOT = Path(__file__).resolve().parents[1]
OWN = "robust_stan"


def _own(cls) -> bool:
    return isinstance(cls, type) and cls.__module__.split(".")[0] == OWN


def _classes_named(annotation) -> list[type]:
    """The package's classes an annotation names (inside ``X | None``, ``list[X]``, ``tuple[X, Y]``)."""
    found = [annotation] if _own(annotation) else []
    for argument in typing.get_args(annotation):
        found += _classes_named(argument)
    return found


def _return_annotation(function):
    hints = typing.get_type_hints(function)
    return hints.get("return", inspect.Signature.empty)


def _documented_in_docs() -> list[object]:
    """Functions and classes README.md or docs/*.md call as ``robust_stan.<module>.<name>``."""
    import importlib

    texts = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs").rglob("*.rst"))]
    found = []
    for path in texts:
        for dotted in re.findall(r"\brobust_stan(?:\.[A-Za-z_]\w*)+", path.read_text()):
            module_name, _, name = dotted.rpartition(".")
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            target = getattr(module, name, None)
            if inspect.isfunction(target) or inspect.isclass(target):
                found.append(target)
    return found


def public_names() -> tuple[dict[str, object], dict[str, object]]:
    """(qualified name -> class, qualified name -> function, method or property), as defined above."""
    queue: list[object] = []
    for name in rs.__all__:
        value = getattr(rs, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            queue.append(value)
        else:
            members = value.values() if isinstance(value, dict) else []
            queue += [type(item) for item in [value, *members] if _own(type(item))]
    queue += _documented_in_docs()
    classes: dict[str, object] = {}
    functions: dict[str, object] = {}

    def add_function(function, is_property=False):
        target = function.fget if is_property else function
        functions.setdefault(f"{target.__module__}.{target.__qualname__}", function)
        if not is_property or _return_annotation(target) is not inspect.Signature.empty:
            queue.extend(_classes_named(_return_annotation(target)))

    while queue:
        item = queue.pop()
        if inspect.isfunction(item):
            add_function(item)
            continue
        key = f"{item.__module__}.{item.__qualname__}"
        if key in classes:
            continue
        classes[key] = item
        for attribute in dir(item):
            if attribute.startswith("_"):
                continue
            owner = next((k for k in item.__mro__ if attribute in vars(k)), None)
            if owner is None or not _own(owner):
                continue
            raw = vars(owner)[attribute]
            if isinstance(raw, property):
                add_function(raw, is_property=True)
            elif isinstance(raw, (staticmethod, classmethod)):
                add_function(raw.__func__)
            elif inspect.isfunction(raw):
                add_function(raw)
    return classes, functions


def _parsed(docstring: str) -> tuple[NumpyDocString | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            parsed = NumpyDocString(docstring)
        except Exception as error:  # numpydoc raises ValueError on a malformed section
            return None, [f"numpydoc cannot parse it: {error}"]
    return parsed, [f"numpydoc: {warning.message}" for warning in caught]


def _documented_parameters(parsed: NumpyDocString) -> list[str]:
    names = []
    for parameter in list(parsed["Parameters"]) + list(parsed["Other Parameters"]):
        names += [name.strip().lstrip("*") for name in parameter.name.split(",") if name.strip()]
    return names


def _signature_parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name not in ("self", "cls")]


def _returns_a_value(function) -> bool:
    """Whether the function's own body (not a nested function's) has ``return <value>``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    body = tree.body[0]
    pending = list(ast.iter_child_nodes(body))
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(node))
    return False


def _parameter_faults(parsed: NumpyDocString, expected: list[str]) -> list[str]:
    documented = _documented_parameters(parsed)
    faults = []
    missing = [name for name in expected if name not in documented]
    extra = [name for name in documented if name not in expected]
    if missing:
        faults.append(f"Parameters lacks {missing}")
    if extra:
        faults.append(f"Parameters names {extra}, which the signature does not have")
    duplicated = sorted({name for name in documented if documented.count(name) > 1})
    if duplicated:
        faults.append(f"Parameters names {duplicated} twice")
    return faults


def _summary_faults(docstring: str | None, missing: str) -> tuple[NumpyDocString | None, list[str]]:
    """The parsed docstring (None when there is none to check further) and its faults so far."""
    if not docstring:
        return None, [missing]
    parsed, faults = _parsed(docstring)
    if parsed is not None and not parsed["Summary"]:
        faults.append("no summary line")
    return parsed, faults


def function_faults(function) -> list[str]:
    parsed, faults = _summary_faults(inspect.getdoc(function), "no docstring")
    if parsed is None:
        return faults
    faults += _parameter_faults(parsed, _signature_parameters(function))
    annotation = _return_annotation(function)
    returns_something = (annotation not in (None, type(None)) if annotation is not inspect.Signature.empty
                         else _returns_a_value(function))
    if returns_something and not (parsed["Returns"] or parsed["Yields"]):
        faults.append("no Returns section")
    return faults


def class_faults(cls) -> list[str]:
    parsed, faults = _summary_faults(inspect.getdoc(cls) if cls.__doc__ else None, "no class docstring")
    if parsed is None:
        return faults
    constructor_owner = next(k for k in cls.__mro__ if "__init__" in vars(k))
    if _own(constructor_owner):
        faults += _parameter_faults(parsed, _signature_parameters(cls))
    return faults


def property_faults(prop) -> list[str]:
    return _summary_faults(inspect.getdoc(prop.fget), "no docstring")[1]


def test_the_definition_reaches_the_names_users_meet():
    classes, functions = public_names()
    for expected in ["robust_stan.api.rob_ula.rob_ula", "robust_stan.api.model_methods.ModelMethods.sample",
                     "robust_stan.results.fits.mcmc.Fit.to_arviz", "robust_stan.results.fits.mcmc.Fit.log_lik",
                     "robust_stan.results.arviz_output.group_names", "robust_stan.common.cluster.task_seeds"]:
        assert expected in functions, expected
    for expected in ["robust_stan.results.fits.mcmc.Fit", "robust_stan.results.fits.variational.VariationalFit",
                     "robust_stan.building.families.Family", "robust_stan.building.divergences.BetaD"]:
        assert expected in classes, expected


def test_every_public_name_has_numpydoc_sections_for_its_signature():
    classes, functions = public_names()
    offenders = []
    for name, cls in sorted(classes.items()):
        offenders += [f"{name}: {fault}" for fault in class_faults(cls)]
    for name, function in sorted(functions.items()):
        faults = property_faults(function) if isinstance(function, property) else function_faults(function)
        offenders += [f"{name}: {fault}" for fault in faults]
    assert not offenders, f"{len(offenders)} docstring faults:\n" + "\n".join(offenders)


def test_the_check_sees_an_undocumented_parameter():
    def documented(alpha: float, *, beta: int = 1) -> float:
        """Add.

        Parameters
        ----------
        alpha : float
            First.

        Returns
        -------
        float
            The sum.
        """
        return alpha + beta

    def unannotated(alpha):
        """Echo.

        Parameters
        ----------
        alpha : float
            First.
        """
        return alpha

    assert function_faults(documented) == ["Parameters lacks ['beta']"]
    assert function_faults(unannotated) == ["no Returns section"]
