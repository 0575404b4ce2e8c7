"""The rules of the house that the import contracts cannot see: who opens a transaction, and how a
transaction's function is typed.

A transaction (``Database.read``, ``.write``, ``.autocommit``, ``.glance``) is opened in two places only: the
operations (``procurd.operations``) and the state path's group-commit writer (``procurd.db.batching``);
``procurd.db.database`` defines them. Everything else that keeps something in the database is given a port
that an operation implements. The scan reads every module of ``src/procurd`` (nothing is imported or run)
and finds a call of one of the four on anything that holds the database, whatever its name: a parameter,
variable, attribute or field typed as the database (or named ``database``/``db``), what is assigned from
one, what a function typed to return one returns; and, whatever the object, a call of ``read``, ``write``
or ``autocommit`` whose function is a transaction's (a lambda that reaches a store of ``Tx``, or a function
that takes a view of it).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import procurd

SOURCE = Path(procurd.__file__).parent
TRANSACTIONS = frozenset({"read", "write", "autocommit", "glance"})
RUNS_A_FUNCTION = frozenset({"read", "write", "autocommit"})
DATABASE_TYPES = frozenset({"Database", "SqliteDatabase", "PostgresDatabase"})
DATABASE_NAMES = frozenset({"database", "db"})

# Where a transaction may be opened: the operations, and the state path's group-commit writer. The writer
# is the one exception because its transaction holds the commands of many callers at once (intakes, claims,
# callbacks and a person's actions committed together); no one caller's operation could own it. The function
# it runs (procurd.procurement.transitions.apply_batch) opens nothing and takes a view of the transaction.
ALLOWED = ("procurd.operations",)
ALLOWED_MODULES = frozenset({"procurd.db.database", "procurd.db.batching"})

# Modules of the provider that still open transactions of their own until the provider moves into one place,
# whose operations open them.
NOT_MOVED_YET = {
    "procurd.provider.callbacks": "the provider",
    "procurd.provider.catalog": "the provider",
}

# Modules of the provider whose transaction functions still take the whole Tx (or Any), for the same reason.
UNTYPED_YET = {
    "procurd.procurement.provider_orders": "the provider",
    "procurd.provider.callbacks": "the provider",
    "procurd.provider.catalog": "the provider",
    "procurd.operations.provider": "the provider",
    "procurd.operations.provider_accounts": "the provider",
}


@dataclass(frozen=True, slots=True)
class Found:
    module: str
    line: int
    call: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.call}"


def modules(root: Path = SOURCE) -> Iterator[tuple[str, ast.Module]]:
    """Every module of the package, by name, parsed."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _names_in(annotation: ast.expr | None) -> set[str]:
    """The names an annotation mentions (``Database | None`` -> ``{"Database", "None"}``)."""
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return set()
    found = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
    return found


def _is_database_type(annotation: ast.expr | None) -> bool:
    return bool(_names_in(annotation) & DATABASE_TYPES)


Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True, slots=True)
class Unit:
    """A function that no other function holds (a module's function, a method), with every node in it: the
    functions and lambdas inside it share its names."""

    function: Function
    nodes: list[ast.AST]


def units(tree: ast.AST) -> Iterator[Unit]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield Unit(node, list(ast.walk(node)))
        elif isinstance(node, ast.ClassDef | ast.If | ast.Try):
            yield from units(node)


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    arguments = function.args
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]


def _decorator_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return set().union(*(_names_in(decorator) for decorator in function.decorator_list))


@dataclass
class Knowledge:
    """What the whole package says holds a database: attribute names and functions that return one."""

    attributes: set[str] = field(default_factory=lambda: set(DATABASE_NAMES))
    factories: set[str] = field(default_factory=lambda: {"open_database"})
    stores: set[str] = field(default_factory=set)  # the stores of Tx
    views: set[str] = field(default_factory=lambda: {"Tx"})  # the types a transaction's function takes

    @classmethod
    def of(cls, trees: Iterable[ast.Module]) -> Knowledge:
        known = cls()
        trees = list(trees)
        for tree in trees:
            known._learn_declarations(tree)
        every = [unit for tree in trees for unit in units(tree)]
        for _ in range(5):  # what is assigned from a database holds one too (until nothing new is found)
            before = (len(known.attributes), len(known.factories))
            for unit in every:
                known._learn_assignments(unit)
            if (len(known.attributes), len(known.factories)) == before:
                break
        return known

    def _learn_declarations(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                if node.name == "Tx":
                    self.stores |= {
                        item.name
                        for item in node.body
                        if isinstance(item, ast.FunctionDef)
                        and _decorator_names(item) & {"property", "cached_property"}
                    }
                bases = set().union(*(_names_in(base) for base in node.bases))
                if "Protocol" in bases and (node.name.endswith("Tx") or node.name.startswith("With")):
                    self.views.add(node.name)
                for item in node.body:
                    if (
                        isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name)
                        and _is_database_type(item.annotation)
                    ):
                        self.attributes.add(item.target.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _is_database_type(node.returns):
                if _decorator_names(node) & {"property", "cached_property"}:
                    self.attributes.add(node.name)
                else:
                    self.factories.add(node.name)
            elif (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Attribute)
                and _is_database_type(node.annotation)
            ):
                self.attributes.add(node.target.attr)

    def _learn_assignments(self, unit: Unit) -> None:
        local = Scope(self, unit)
        for node in unit.nodes:
            if isinstance(node, ast.Assign) and local.holds(node.value):
                self.attributes |= {
                    target.attr for target in node.targets if isinstance(target, ast.Attribute)
                }
            elif isinstance(node, ast.Return) and node.value is not None and local.holds(node.value):
                self.factories.add(unit.function.name)


class Scope:
    """The names of one function (and the functions inside it) that hold a database."""

    def __init__(self, known: Knowledge, unit: Unit) -> None:
        self.known = known
        self.names = set(DATABASE_NAMES)
        for node in unit.nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                self.names |= {arg.arg for arg in _parameters(node) if _is_database_type(arg.annotation)}
        for _ in range(5):
            before = len(self.names)
            for node in unit.nodes:
                if isinstance(node, ast.Assign) and self.holds(node.value):
                    self.names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    if _is_database_type(node.annotation) or (
                        node.value is not None and self.holds(node.value)
                    ):
                        self.names.add(node.target.id)
                elif isinstance(node, ast.NamedExpr) and self.holds(node.value):
                    self.names.add(node.target.id)
            if len(self.names) == before:
                break

    def holds(self, expression: ast.expr) -> bool:
        """Whether ``expression`` is a database."""
        if isinstance(expression, ast.Await):
            return self.holds(expression.value)
        if isinstance(expression, ast.Name):
            return expression.id in self.names
        if isinstance(expression, ast.Attribute):
            return expression.attr in self.known.attributes
        if isinstance(expression, ast.Call):
            called = expression.func
            name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", None)
            return name in self.known.factories
        if isinstance(expression, ast.BoolOp):
            return any(self.holds(part) for part in expression.values)
        if isinstance(expression, ast.IfExp):
            return self.holds(expression.body) or self.holds(expression.orelse)
        return False


def _transaction_functions(tree: ast.Module, known: Knowledge) -> set[str]:
    """The functions of a module whose first parameter is a transaction (``Tx`` or a view of it)."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        function = node
        parameters = [arg for arg in _parameters(function) if arg.arg not in ("self", "cls")]
        if parameters and _names_in(parameters[0].annotation) & known.views:
            found.add(function.name)
    return found


def _runs_a_transaction(call: ast.Call, functions: set[str], known: Knowledge) -> bool:
    """Whether the first argument of ``call`` is a transaction's function, whoever is called."""
    if not call.args:
        return False
    first = call.args[0]
    if isinstance(first, ast.Lambda):
        parameters = _parameters(first)
        if not parameters:
            return False
        tx = parameters[0].arg
        return any(
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == tx
            and node.attr in known.stores | {"connection"}
            for node in ast.walk(first.body)
        )
    name = first.id if isinstance(first, ast.Name) else getattr(first, "attr", None)
    return name in functions


def transactions_opened(trees: dict[str, ast.Module], known: Knowledge) -> list[Found]:
    """Every call that opens a transaction, by module and line."""
    found: set[Found] = set()
    for module, tree in trees.items():
        functions = _transaction_functions(tree, known)
        for unit in units(tree):
            scope = Scope(known, unit)
            for node in unit.nodes:
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                method = node.func.attr
                if method in TRANSACTIONS and (
                    scope.holds(node.func.value)
                    or (method in RUNS_A_FUNCTION and _runs_a_transaction(node, functions, known))
                ):
                    found.add(Found(module, node.lineno, ast.unparse(node.func)))
    return sorted(found, key=lambda item: (item.module, item.line))


def _allowed(module: str) -> bool:
    return module in ALLOWED_MODULES or any(
        module == place or module.startswith(place + ".") for place in ALLOWED
    )


@functools.cache
def _package() -> tuple[dict[str, ast.Module], Knowledge]:
    trees = dict(modules())
    return trees, Knowledge.of(trees.values())


def test_transactions_are_opened_by_the_operations_and_the_batch_writer_alone() -> None:
    """No module outside the operations and the batch writer opens a transaction (those listed in
    NOT_MOVED_YET are on their way)."""
    trees, known = _package()
    found = transactions_opened(trees, known)
    outside = [str(item) for item in found if not _allowed(item.module) and item.module not in NOT_MOVED_YET]
    assert outside == []
    # The scan sees what it must: the operations open transactions, and so does the batch writer.
    assert {item.module for item in found} >= {
        "procurd.operations.status",
        "procurd.operations.sign_in",
        "procurd.operations.instances",
        "procurd.db.batching",
    }


SAMPLE = """
from procurd.db.database import Database, open_database

STATEMENT = None


class Holder:
    def __init__(self, store: Database) -> None:
        self.store = store

    async def go(self) -> None:
        await self.store.read(lambda tx: 1)


class Kept:
    handle: Database | None = None

    async def go(self) -> None:
        await self.handle.glance(STATEMENT)


def take(tx: WithLeases, name: str) -> None:
    tx.leases.release(name, "me")


async def opened(runtime, keeper: "Database", response, stream, thing) -> None:
    alias = runtime.database
    await alias.write(lambda tx: None)
    other = open_database("sqlite+aiosqlite:///x.db")
    await other.glance(STATEMENT)
    await keeper.autocommit(lambda t: t.leases.release("a", "b"))
    await thing.write(lambda t: t.leases.release("a", "b"))
    await thing.write(take, "a")
    await response.read()
    await stream.read(100)
    await thing.write(b"bytes")
"""


def test_the_scan_finds_a_database_under_any_name() -> None:
    """A transaction is found whatever the variable, attribute or field holding the database is called, and
    through any object when its function is a transaction's; reading a response or a stream is not one."""
    trees, _ = _package()
    sample = ast.parse(SAMPLE)
    storage = [trees["procurd.db.stores"], trees["procurd.db.views"], trees["procurd.db.database"]]
    found = transactions_opened({"sample": sample}, Knowledge.of([*storage, sample]))
    lines = SAMPLE.splitlines()
    assert [lines[item.line - 1].strip() for item in found] == [
        "await self.store.read(lambda tx: 1)",
        "await self.handle.glance(STATEMENT)",
        "await alias.write(lambda tx: None)",
        "await other.glance(STATEMENT)",
        'await keeper.autocommit(lambda t: t.leases.release("a", "b"))',
        'await thing.write(lambda t: t.leases.release("a", "b"))',
        'await thing.write(take, "a")',
    ]


def whole_transactions(module: str, tree: ast.Module) -> list[str]:
    """Every parameter or variable of ``module`` typed as the whole Tx (or a ``tx`` typed Any)."""
    whole = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            typed = [(arg.arg, arg.annotation) for arg in _parameters(node)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            typed = [(node.target.id, node.annotation)]
        else:
            continue
        for name, annotation in typed:
            names = _names_in(annotation)
            if "Tx" in names or (name == "tx" and "Any" in names):
                whole.append(f"{module}:{node.lineno}: {name}: {ast.unparse(annotation)}")  # type: ignore[arg-type]
    return whole


def test_a_transaction_names_the_stores_it_needs() -> None:
    """A transaction's function takes a view of the stores it uses (procurd.db.views), never the whole Tx or
    Any, outside the storage itself (those listed in UNTYPED_YET are on their way)."""
    trees, _ = _package()
    whole = [
        found
        for module, tree in trees.items()
        if not module.startswith("procurd.db.") and module not in UNTYPED_YET
        for found in whole_transactions(module, tree)
    ]
    assert whole == []


def test_no_module_is_excused_that_needs_no_excuse() -> None:
    """Every module listed in NOT_MOVED_YET still opens a transaction, and every one in UNTYPED_YET still
    takes the whole Tx: once it no longer does, its entry goes (and the rule holds for it again)."""
    trees, known = _package()
    opening = {item.module for item in transactions_opened(trees, known)}
    assert sorted(set(NOT_MOVED_YET) - opening) == []
    assert sorted(module for module in UNTYPED_YET if not whole_transactions(module, trees[module])) == []
