"""Storage's SQL statements: declared once, at import; compiled for PostgreSQL on first use.

A statement is written once, in the subset SQLite and PostgreSQL share, with SQLite's `?`
or `?N` placeholders, and declared at module level with `statement()`. Its PostgreSQL
spelling is compiled (tokenized: strings, quoted names, comments, placeholders, words,
operators) the first time PostgreSQL runs it and kept on the statement, so a hot path (the
flush, payments) pays nothing per call, and a process on SQLite never pays for it
(compiling every declared statement costs about a fifth of importing the app).

The compiler knows a closed list of constructs. It respells the few the two engines spell
differently (`RESPELLED`), passes through the functions and words they share with one meaning
(`SHARED_FUNCTIONS`, `SHARED_WORDS`), and refuses anything else with UnsupportedSQL: a
function it does not know, SQLite-only syntax (INSERT OR REPLACE, GLOB, `==`, `a IS b`
between values), PostgreSQL-only syntax (`::`, `$1`), a placeholder style it cannot map.
Where the engines differ in substance a statement is declared per engine with `by_dialect()`,
each text in its engine's own spelling (placeholders still `?`).

Dynamic statements (filters, segments) are composed from declared fragments: `fragment()`
declares a piece with a probe statement it completes (so the suite can prepare it on both
engines), and `compose()` joins declared pieces into a statement, compiled once per text.
`REGISTRY` holds every declared statement and fragment probe: tests/test_statements.py
compiles and prepares each on both engines, so a construct the compiler refuses fails the
suite, not a PostgreSQL deployment.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from typing import NamedTuple

import orjson

ENGINES = ("sqlite", "postgres")


class UnsupportedSQL(ValueError):
    """A statement uses a construct the compiler does not know to mean the same on both engines."""


# --- tokens -------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>--[^\n]*|/\*.*?\*/)
  | (?P<string>'(?:[^']|'')*')
  | (?P<name>"(?:[^"]|"")*")
  | (?P<dollar>\$(?P<tag>[A-Za-z_]*)\$.*?\$(?P=tag)\$)
  | (?P<param>\?[0-9]*)
  | (?P<number>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\|\||::|<=|>=|<>|!=|[-+*/%<>=(),;.\[\]])
""", re.VERBOSE | re.DOTALL)


class Token(NamedTuple):
    kind: str  # space, comment, string, dollar, name, param, number, word, op
    text: str

    @property
    def upper(self) -> str:
        return self.text.upper()


def tokenize(sql: str) -> list[Token]:
    tokens, at = [], 0
    while at < len(sql):
        match = _TOKEN.match(sql, at)
        if match is None:
            raise UnsupportedSQL(f"cannot read {sql[at:at + 20]!r} in: {_short(sql)}")
        kind = "dollar" if match.group("dollar") else match.lastgroup
        tokens.append(Token(kind, match.group(0)))
        at = match.end()
    return tokens


def _short(sql: str) -> str:
    return " ".join(sql.split())[:200]


# --- what the compiler knows ---------------------------------------------------------------

# Functions both engines have with the same meaning on the values storage gives them.
SHARED_FUNCTIONS = frozenset({"cast", "coalesce", "count", "exists", "nullif", "sum"})
# Functions the compiler respells for PostgreSQL (see _respell).
RESPELLED = frozenset({"max", "min", "lower", "upper", "instr", "json_each"})

# Words a `(` may follow that are not function calls.
_KEYWORDS_BEFORE_PAREN = frozenset({
    "IN", "VALUES", "EXISTS", "AS", "ON", "AND", "OR", "NOT", "WHERE", "SELECT", "FROM",
    "JOIN", "THEN", "ELSE", "WHEN", "OVER", "FILTER", "USING", "BY", "ALL", "ANY", "CONFLICT",
    "IS", "CASE", "RETURNING", "SET", "HAVING", "LIMIT", "OFFSET", "WITH", "UNION", "EXCEPT",
    "INTERSECT",
})
# Words that name something after which a `(` opens a column list, not a call.
_BEFORE_COLUMN_LIST = frozenset({"INTO", "TABLE"})
# SQLite-only or meaning-changing words, refused wherever they appear outside literals.
_REFUSED_WORDS = {
    "GLOB": "GLOB is SQLite's", "REGEXP": "REGEXP is SQLite's", "MATCH": "MATCH is SQLite's",
    "PRAGMA": "a PRAGMA is SQLite's (the connection handles busy_timeout itself)",
    "AUTOINCREMENT": "AUTOINCREMENT is SQLite's", "ROWID": "rowid is SQLite's",
    "ISNULL": "ISNULL is SQLite's", "NOTNULL": "NOTNULL is SQLite's",
    "INDEXED": "INDEXED BY is SQLite's", "ATTACH": "ATTACH is SQLite's",
    "LIKE": "LIKE ignores ASCII case on SQLite only",
    "ILIKE": "ILIKE is PostgreSQL's",
    "COLLATE": "collations differ between the engines",
    "CURRENT_TIMESTAMP": "the engines spell the time differently; pass it as a parameter",
    "CURRENT_DATE": "the engines spell the date differently; pass it as a parameter",
    "CURRENT_TIME": "the engines spell the time differently; pass it as a parameter",
}
# Words after which a name is not a table alias.
_RESERVED = frozenset({
    "WHERE", "CROSS", "JOIN", "ON", "ORDER", "GROUP", "LIMIT", "UNION", "LEFT", "INNER",
    "HAVING", "WINDOW", "EXCEPT", "INTERSECT", "OFFSET", "USING", "NATURAL", "RIGHT", "FULL",
    "AND", "OR", "SET", "RETURNING", "WITH",
})
_SQLITE_TYPES = {"INTEGER": "BIGINT", "TEXT": "TEXT", "REAL": "DOUBLE PRECISION",
                 "BIGINT": "BIGINT", "NUMERIC": "NUMERIC"}


class Compiled(NamedTuple):
    """A statement's PostgreSQL spelling and how its parameters map onto it: `text` with
    psycopg's %s placeholders, `raw` the same with PostgreSQL's own $1, $2, ... in their
    place (the same values), which psycopg sends as it is: it splits a text at its
    placeholders at each run where it is past the length or count it caches (the payment
    statement, about 7,000 characters)."""

    text: str
    order: tuple[int, ...] | None  # the parameter each placeholder takes, None: in turn
    lists: frozenset[int]  # placeholders whose JSON-array text becomes a list
    null_tests: frozenset[int]  # placeholders that take whether their value is None
    raw: str = ""

    def arguments(self, params):
        if not params:
            return params
        values = list(params) if self.order is None else [params[i] for i in self.order]
        for i in self.lists:
            if isinstance(values[i], str | bytes):
                values[i] = [_ListText(v) if isinstance(v, str) else v
                             for v in orjson.loads(values[i])]
        for i in self.null_tests:
            values[i] = values[i] is None
        return values


class _ListText(str):
    """A str inside a list parameter: typed text, so the array is text[] (unnest needs a type)."""


# --- the compiler ---------------------------------------------------------------------------

class _Compiler:
    def __init__(self, sql: str, native: bool):
        self.sql = sql
        self.native = native
        self.tokens = tokenize(sql)
        self.out = [t.text for t in self.tokens]
        self.marks: dict[int, str] = {}  # token index of a placeholder -> "list" or "isnull"
        self.sig = [i for i, t in enumerate(self.tokens) if t.kind not in ("space", "comment")]
        self.pos = {index: n for n, index in enumerate(self.sig)}
        self.closing = self._match_parens()

    def refuse(self, why: str):
        raise UnsupportedSQL(f"{why}: {_short(self.sql)}")

    def _match_parens(self) -> dict[int, int]:
        closing, stack = {}, []
        for i in self.sig:
            text = self.tokens[i].text
            if text == "(":
                stack.append(i)
            elif text == ")":
                if not stack:
                    self.refuse("a ) without its (")
                closing[stack.pop()] = i
        if stack:
            self.refuse("a ( without its )")
        return closing

    def at(self, n: int) -> Token | None:
        return self.tokens[self.sig[n]] if 0 <= n < len(self.sig) else None

    def is_word(self, n: int, *words: str) -> bool:
        token = self.at(n)
        return token is not None and token.kind == "word" and token.upper in words

    def is_op(self, n: int, text: str) -> bool:
        token = self.at(n)
        return token is not None and token.kind == "op" and token.text == text

    def blank(self, first: int, last: int) -> None:
        """Blank the tokens from sig position first to last, and what lies between them."""
        for i in range(self.sig[first], self.sig[last] + 1):
            self.out[i] = ""

    def compile(self) -> Compiled:
        if not self.native:
            self._check()
        self._respell()
        return self._placeholders()

    # The closed list: anything else is refused.
    def _check(self) -> None:
        for n, i in enumerate(self.sig):
            token = self.tokens[i]
            if token.kind == "op" and token.text in ("::", "[", "]"):
                self.refuse(f"{token.text} is PostgreSQL's")
            if token.kind == "dollar":
                self.refuse("dollar quoting is PostgreSQL's")
            if token.kind != "word":
                continue
            word = token.upper
            if word in _REFUSED_WORDS:
                self.refuse(_REFUSED_WORDS[word])
            if word == "INSERT" and self.is_word(n + 1, "OR") and not self.is_word(n + 2, "IGNORE"):
                self.refuse(f"INSERT OR {self.at(n + 2).text} has no PostgreSQL spelling here;"
                            " write INSERT ... ON CONFLICT (...) DO UPDATE")
            if word == "REPLACE" and self.is_word(n + 1, "INTO"):
                self.refuse("REPLACE INTO is SQLite's")
            if word == "IS" and not self._is_test(n):
                self.refuse("`a IS b` between values is SQLite's; write IS [NOT] DISTINCT FROM")
            if word in ("DISTINCT",) and self.is_word(n + 1, "ON"):
                self.refuse("DISTINCT ON is PostgreSQL's")
            if self.is_op(n + 1, "("):
                self._check_call(n, word)

    def _is_test(self, n: int) -> bool:
        """Whether the IS at sig position n tests NULL, TRUE, FALSE or DISTINCT FROM."""
        after = n + 2 if self.is_word(n + 1, "NOT") else n + 1
        return self.is_word(after, "NULL", "TRUE", "FALSE", "DISTINCT")

    def _check_call(self, n: int, word: str) -> None:
        if word in _KEYWORDS_BEFORE_PAREN:
            return
        if self.is_word(n - 1, *_BEFORE_COLUMN_LIST):
            return
        closing = self.pos[self.closing[self.sig[n + 1]]]
        if self.is_word(closing + 1, "AS") and self.is_op(closing + 2, "("):
            return  # a common table expression's name and columns
        if self.is_word(n - 1, "AS"):
            return  # an alias's column list
        name = word.lower()
        if name not in SHARED_FUNCTIONS and name not in RESPELLED:
            self.refuse(f"{name}() is not known to mean the same on SQLite and PostgreSQL;"
                        " add it to storage.statements or declare the statement by_dialect()")

    def _respell(self) -> None:
        for n, i in enumerate(self.sig):
            token = self.tokens[i]
            if token.kind == "word":
                self._respell_word(n, token.upper)

    def _respell_word(self, n: int, word: str) -> None:
        call = self.is_op(n + 1, "(") and not self.is_word(n - 1, *_BEFORE_COLUMN_LIST)
        i = self.sig[n]
        if word in ("NOT", "IN"):
            self._in_json_list(n)
        elif (word == "INSERT" and self.is_word(n + 1, "OR") and self.is_word(n + 2, "IGNORE")
              and self.is_word(n + 3, "INTO")):
            self.blank(n + 1, n + 2)  # OR IGNORE
            self.out[self.sig[n]] = "INSERT "
            self._on_conflict_do_nothing()
        elif word == "CAST" and call:
            self._cast_type(n)
        elif self.at(n).kind == "word" and word in ("MAX", "MIN") and call:
            if self._arguments(n + 1) > 1:
                self.out[i] = "GREATEST" if word == "MAX" else "LEAST"
        elif word in ("LOWER", "UPPER") and call:
            # lower() and upper() change only ASCII letters in SQLite; under COLLATE "C" the same.
            opening = self.sig[n + 1]
            self.out[opening] += "("
            self.out[self.closing[opening]] = ') COLLATE "C")'
        elif word == "INSTR" and call:
            self.out[i] = "strpos"
        elif word == "JSON_EACH" and call:
            self._json_each(n)

    def _arguments(self, n: int) -> int:
        """How many arguments the call whose ( is at sig position n takes."""
        opening = self.sig[n]
        end = self.pos[self.closing[opening]]
        if end == n + 1:
            return 0
        count, depth = 1, 0
        for m in range(n + 1, end):
            text = self.at(m).text if self.at(m).kind == "op" else ""
            depth += {"(": 1, ")": -1}.get(text, 0)
            count += text == "," and depth == 0
        return count

    def _in_json_list(self, n: int) -> None:
        # `x [NOT] IN (SELECT value FROM json_each(?))`, storage's one-statement list
        # parameter, is `x = ANY(?)` / `x <> ALL(?)` with the JSON list decoded, so the
        # array takes x's type.
        negated = self.is_word(n, "NOT")
        start = n + 1 if negated else n
        if not self.is_word(start, "IN") or (not negated and self.is_word(n - 1, "NOT")):
            return
        shape = [("op", "("), ("word", "SELECT"), ("word", "VALUE"), ("word", "FROM"),
                 ("word", "JSON_EACH"), ("op", "("), ("param", None), ("op", ")"), ("op", ")")]
        for offset, (kind, text) in enumerate(shape, start=1):
            token = self.at(start + offset)
            if token is None or token.kind != kind or (text and token.upper != text):
                return
        param = start + 7
        self.blank(n, param - 1)
        self.out[self.sig[n]] = "<> ALL(" if negated else "= ANY("
        self.blank(param + 1, param + 2)
        self.out[self.sig[param + 1]] = ")"
        self.marks[self.sig[param]] = "list"

    def _json_each(self, n: int) -> None:
        param = self.at(n + 2)
        if param is None or param.kind != "param" or not self.is_op(n + 3, ")"):
            self.out[self.sig[n]] = "tally_json_each"
            return
        if self.marks.get(self.sig[n + 2]) == "list":
            return
        # `FROM json_each(?) AS w` walks a JSON array parameter: unnest the decoded list,
        # so w.value has the elements' type.
        self.out[self.sig[n]] = "unnest"
        self.marks[self.sig[n + 2]] = "list"
        after = n + 4
        if self.is_word(after, "AS"):
            after += 1
        alias = self.at(after)
        if alias is not None and alias.kind == "word" and alias.upper not in _RESERVED:
            self.out[self.sig[after]] = f"{alias.text}(value)"
            if not self.is_word(n + 4, "AS"):
                self.out[self.sig[after]] = f"AS {alias.text}(value)"
        else:
            self.out[self.sig[n + 3]] = ") AS json_each(value)"

    def _cast_type(self, n: int) -> None:
        # CAST(x AS INTEGER): SQLite's INTEGER holds 64 bits, PostgreSQL's 32.
        end = self.pos[self.closing[self.sig[n + 1]]]
        if self.is_word(end - 2, "AS") and self.at(end - 1).kind == "word":
            name = self.at(end - 1).upper
            if name not in _SQLITE_TYPES:
                self.refuse(f"CAST to {name} is not known to mean the same on both engines")
            self.out[self.sig[end - 1]] = _SQLITE_TYPES[name]
        else:
            self.refuse("a CAST the compiler cannot read")

    def _on_conflict_do_nothing(self) -> None:
        depth = 0
        for n, i in enumerate(self.sig):
            text = self.tokens[i].text
            depth += {"(": 1, ")": -1}.get(text, 0) if self.tokens[i].kind == "op" else 0
            if depth == 0 and self.is_word(n, "RETURNING"):
                self.out[i] = "ON CONFLICT DO NOTHING " + self.out[i]
                return
            if self.is_word(n, "ON") and self.is_word(n + 1, "CONFLICT"):
                self.refuse("INSERT OR IGNORE with its own ON CONFLICT")
        last = len(self.sig) - 1
        if self.is_op(last, ";"):
            last -= 1
        self.out[self.sig[last]] += " ON CONFLICT DO NOTHING"

    def _placeholders(self) -> Compiled:
        order: list[int] = []
        lists, null_tests = set(), set()
        styles = set()
        sig = set(self.sig)
        for n, i in enumerate(self.sig):
            # `? IS [NOT] NULL` leaves PostgreSQL no type to give the parameter: the test
            # is made in Python.
            if self.tokens[i].kind == "param" and self.is_word(n + 1, "IS"):
                negated = self.is_word(n + 2, "NOT")
                null = n + 3 if negated else n + 2
                if self.is_word(null, "NULL"):
                    self.marks[i] = "isnull"
                    self.blank(n + 1, null)
                    self.out[self.sig[n + 1]] = f"= {0 if negated else 1})"
                    self.out[i] = "(" + self.out[i]
        raw = list(self.out)
        for i, token in enumerate(self.tokens):
            if token.kind == "param" and i in sig:
                number = token.text[1:]
                styles.add(bool(number))
                order.append(int(number) - 1 if number else len(order))
                mark = self.marks.get(i)
                if mark == "list":
                    lists.add(len(order) - 1)
                elif mark == "isnull":
                    null_tests.add(len(order) - 1)
                raw[i] = raw[i].replace(token.text, f"${len(order)}")
                self.out[i] = self.out[i].replace(token.text, "%s")
            else:
                # psycopg reads % inside literals and comments too
                self.out[i] = self.out[i].replace("%", "%%")
        if len(styles) > 1:
            self.refuse("? and ?N placeholders mixed")
        numbered = True in styles
        return Compiled("".join(self.out), tuple(order) if numbered else None,
                        frozenset(lists), frozenset(null_tests), "".join(raw))


def parameter_count(sql: str) -> int:
    """How many parameters a statement in SQLite's spelling takes."""
    params = [t.text for t in tokenize(sql) if t.kind == "param"]
    numbered = [int(p[1:]) for p in params if p != "?"]
    return max(numbered) if numbered else len(params)


@functools.lru_cache(maxsize=4096)
def translate(sql: str) -> Compiled:
    """The PostgreSQL spelling of a statement written in the shared subset; UnsupportedSQL
    for a construct the compiler does not know."""
    return _Compiler(sql, native=False).compile()


@functools.lru_cache(maxsize=1024)
def translate_native(sql: str) -> Compiled:
    """A statement in PostgreSQL's own spelling: the closed list is not checked (it is
    PostgreSQL's text), placeholders and SQLite's list and NULL-test parameters are mapped as
    in translate()."""
    return _Compiler(sql, native=True).compile()


# --- the registry ---------------------------------------------------------------------------

class Statement(str):
    """A declared statement: its SQLite text (the str itself) and its compiled PostgreSQL
    spelling (None: a statement for SQLite only), compiled on first use."""

    engines: tuple[str, ...]
    module: str
    _compile: Callable[[str], Compiled] | None

    @functools.cached_property
    def postgres(self) -> Compiled | None:
        return None if self._compile is None else self._compile(str(self))


class Fragment(str):
    """A declared piece of a dynamic statement; compose() joins pieces into a Statement."""

    def format(self, *args, **kwargs) -> Fragment:
        for value in (*args, *kwargs.values()):
            if not isinstance(value, Fragment | Statement | int):
                raise TypeError(f"a fragment is filled with declared fragments only: {value!r}")
        return Fragment(str.format(self, *args, **kwargs))

    def __add__(self, other) -> Fragment:
        if not isinstance(other, Fragment | Statement):
            raise TypeError(f"a fragment joins declared fragments only: {other!r}")
        return Fragment(str(self) + other)

    def __mul__(self, times: int) -> Fragment:
        return Fragment(str(self) * times)


class Probe(NamedTuple):
    sql: str  # what the suite prepares
    engines: tuple[str, ...]
    module: str
    postgres_native: bool  # the PostgreSQL text is PostgreSQL's own spelling


REGISTRY: list[Probe] = []


def _caller_module() -> str:
    return sys._getframe(2).f_globals.get("__name__", "?")


def _make(sql: str, compile_postgres: Callable[[str], Compiled] | None, engines: tuple[str, ...],
          module: str) -> Statement:
    made = Statement(sql)
    made._compile = compile_postgres
    made.engines = engines
    made.module = module
    return made


def statement(sql: str) -> Statement:
    """Declare a statement written in the shared subset."""
    module = _caller_module()
    made = _make(sql, translate, ENGINES, module)
    REGISTRY.append(Probe(sql, ENGINES, module, False))
    return made


def by_dialect(*, sqlite: str, postgres: str) -> dict[str, Statement]:
    """Declare a statement the engines spell differently: each text in its own engine's
    spelling, with `?` placeholders. Execute `declared[dialect(conn)]`."""
    module = _caller_module()
    REGISTRY.append(Probe(sqlite, ("sqlite",), module, False))
    REGISTRY.append(Probe(postgres, ("postgres",), module, True))
    return {"sqlite": _make(sqlite, None, ("sqlite",), module),
            "postgres": _make(postgres, translate_native, ("postgres",), module)}


EMPTY = Fragment("")


def join(pieces) -> Fragment:
    """Declared fragments one after the other."""
    joined = EMPTY
    for piece in pieces:
        joined += piece
    return joined


def fragment(sql: str, probe: str) -> Fragment:
    """Declare a piece of dynamic statements, and a statement (`probe`, with `{}` where the
    piece goes) that the suite prepares with it on both engines. The piece may have
    `{slot}`s of its own (filled by Fragment.format), left empty in the probe."""
    module = _caller_module()
    whole = probe.replace("{}", sql.format_map(_Blank()))
    REGISTRY.append(Probe(whole, ENGINES, module, False))
    return Fragment(sql)


class Template:
    """A declared statement with named slots, filled with declared fragments only."""

    def __init__(self, sql: str):
        self.sql = sql

    def fill(self, **parts: str) -> Statement:
        for name, part in parts.items():
            if not isinstance(part, Fragment):
                raise TypeError(f"slot {name} takes a declared fragment: {part!r}")
        return _composed(self.sql.format(**parts))


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return ""


def template(sql: str, *probes: dict[str, Fragment]) -> Template:
    """Declare a dynamic statement whose `{slot}`s take declared fragments. The suite
    prepares it once per probe, a probe's slots filled so and the others left empty (an
    empty slot must leave a statement); no probe: every slot empty."""
    module = _caller_module()
    for probe in probes or ({},):
        whole = sql.format_map(_Blank(probe))
        REGISTRY.append(Probe(whole, ENGINES, module, False))
    return Template(sql)


def compose(*pieces: str) -> Statement:
    """A dynamic statement made of declared fragments and statements, compiled once per text."""
    for piece in pieces:
        if not isinstance(piece, Fragment | Statement):
            raise TypeError(f"a statement is composed of declared fragments only: {piece!r}")
    return _composed("".join(pieces))


@functools.lru_cache(maxsize=4096)
def _composed(sql: str) -> Statement:
    return _make(sql, translate, ENGINES, "composed")


def native(engine: str, sql: str) -> Statement:
    """Declare a statement for one engine only, in that engine's spelling (a PRAGMA, a
    catalog query); run on the other engine it raises UnsupportedSQL."""
    module = _caller_module()
    REGISTRY.append(Probe(sql, (engine,), module, engine == "postgres"))
    return _make(sql, translate_native if engine == "postgres" else None, (engine,), module)


def postgres_spelling(sql: str) -> Statement:
    """A statement in PostgreSQL's own spelling that no module declares: one PostgreSQL
    writes itself (storage/check.py's foreign key checks) or a test's own."""
    return _make(sql, translate_native, ("postgres",), "undeclared")
