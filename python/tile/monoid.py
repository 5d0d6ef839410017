"""The monoids a reduction folds with (include/tile/monoid.hpp), as in C++: ``tile.monoid.sum()``.

    sum                 x -> (s,)
    max                 x -> (m,)              NaN if any element is NaN
    online_softmax      x -> (m, s)            s = sum(exp(x - m)); one pass; all -inf gives s = 0
    mean_m2             x -> (n, mean, m2)     m2 = sum((x - mean)^2), Chan et al.'s merge
    scaled_sum_squares  x -> (m, s)            sum(x^2) = s * m^2 with m = max|x|: no overflow
"""

from . import _tile

__all__ = ["Monoid", "sum", "max", "online_softmax", "mean_m2", "scaled_sum_squares"]


class Monoid:
    """A built-in monoid: its name, the names of its state's parts, and the inputs it folds."""

    __slots__ = ("name", "parts", "inputs")

    def __init__(self, name):
        parts, inputs = _tile.monoid_parts(name)
        self.name = name
        self.parts = tuple(parts)
        self.inputs = inputs

    def __repr__(self):
        return f"tile.monoid.{self.name}() -> ({', '.join(self.parts)})"

    def __eq__(self, other):
        return isinstance(other, Monoid) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


def sum():  # noqa: A001 - the C++ name
    return Monoid("sum")


def max():  # noqa: A001 - the C++ name
    return Monoid("max")


def online_softmax():
    return Monoid("online_softmax")


def mean_m2():
    return Monoid("mean_m2")


def scaled_sum_squares():
    return Monoid("scaled_sum_squares")
