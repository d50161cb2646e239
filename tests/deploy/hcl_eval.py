"""Evaluates the few HCL2 expressions deploy/nomad uses to build a task's args from its
variables (python-hcl2 parses them but returns them as "${...}" text): string templates, tuples,
`var.NAME`, `==`/`!=`, the conditional `c ? a : b`, `for` over a list or map, and the functions
concat, flatten and length, as Nomad evaluates them. Anything else is refused (an
AssertionError naming the construct), so a new construct in a job file fails the checks instead
of being misread.
"""

from lark import Token, Tree

import hcl2.api

FUNCTIONS = {
    "concat": lambda *lists: [x for lst in lists for x in lst],
    "length": len,
}


def _flatten(value):
    out = []
    for x in value:
        out.extend(_flatten(x) if isinstance(x, list) else [x])
    return out


FUNCTIONS["flatten"] = _flatten


def evaluate(text, variables):
    """The value of `text` (an expression, or python-hcl2's "${expression}") with
    `var.NAME` = variables[NAME]."""
    if text.startswith("${") and text.endswith("}"):
        text = text[2:-1]
    tree = hcl2.api.parses_to_tree(f"x = {text}\n")
    body = next(c for c in tree.children if isinstance(c, Tree) and c.data == "body")
    attr = next(c for c in body.children if isinstance(c, Tree) and c.data == "attribute")
    expr = [c for c in attr.children if isinstance(c, Tree)][-1]
    return _eval(expr, {"var": dict(variables)})


def _parts(node):
    """The child trees and identifier tokens of a node: no punctuation, no comments."""
    return [c for c in node.children
            if (isinstance(c, Tree) and c.data != "new_line_or_comment")
            or (isinstance(c, Token) and c.type in ("NAME", "IDENTIFIER", "DECIMAL", "INT_LITERAL"))]


def _name(node):
    if isinstance(node, Token):
        return str(node)
    assert node.data == "identifier", f"expected an identifier, found {node.data}"
    return str(node.children[0])


def _eval(node, scope):
    if isinstance(node, Token):
        raise AssertionError(f"HCL token {node.type} {node!s} not understood here")
    kind = node.data
    parts = _parts(node)
    if kind == "expr_term":
        (inner,) = parts
        return _eval(inner, scope)
    if kind == "identifier":
        name = _name(node)
        assert name in scope, f"HCL: {name} is not defined"
        return scope[name]
    if kind == "get_attr_expr_term":
        base, attr = parts
        value = _eval(base, scope)
        key = _name(_parts(attr)[0])
        assert isinstance(value, dict) and key in value, f"HCL: no attribute {key}"
        return value[key]
    if kind == "string":
        return "".join(_eval(p, scope) for p in parts)
    if kind == "string_part":
        if not parts:
            return "".join(str(c) for c in node.children)
        (inner,) = parts
        return str(_eval(inner, scope))
    if kind == "interpolation":
        (inner,) = parts
        return _eval(inner, scope)
    if kind == "tuple":
        return [_eval(p, scope) for p in parts]
    if kind == "function_call":
        name = _name(parts[0])
        assert name in FUNCTIONS, f"HCL function {name} not understood here"
        args = _parts(parts[1]) if len(parts) > 1 else []
        return FUNCTIONS[name](*[_eval(a, scope) for a in args])
    if kind == "conditional":
        cond, yes, no = parts
        return _eval(yes, scope) if _eval(cond, scope) else _eval(no, scope)
    if kind == "binary_op":
        left, term = parts
        op = next(c for c in term.children if isinstance(c, Tree) and c.data == "binary_operator"
                  or isinstance(c, Token) and c.type == "BINARY_OPERATOR")
        op = str(op.children[0]) if isinstance(op, Tree) else str(op)
        right = [c for c in _parts(term) if not (isinstance(c, Tree) and c.data == "binary_operator")]
        a, b = _eval(left, scope), _eval(right[0], scope)
        assert op in ("==", "!="), f"HCL operator {op} not understood here"
        return (a == b) if op == "==" else (a != b)
    if kind == "for_tuple_expr":
        intro, *rest = parts
        assert len(rest) == 1, "HCL: `for ... if` not understood here"
        names = [_name(p) for p in _parts(intro) if isinstance(p, Token) or p.data == "identifier"]
        source = _eval(next(p for p in _parts(intro) if isinstance(p, Tree) and p.data != "identifier"), scope)
        items = sorted(source.items()) if isinstance(source, dict) else list(enumerate(source))
        out = []
        for key, value in items:
            inner = dict(scope)
            if len(names) == 2:
                inner[names[0]], inner[names[1]] = key, value
            else:
                inner[names[0]] = value
            out.append(_eval(rest[0], inner))
        return out
    raise AssertionError(f"HCL construct {kind} not understood here")
