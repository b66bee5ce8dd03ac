"""The prelude: what every program, and every test run beside or instead of it, starts with."""

# Imports APPS's own grader gives every program (minus numpy, absent from the sandbox's
# interpreter), so solutions written against that grader run unchanged; and no cap on the
# digits of an int printed or parsed (Python 3.11's 4,300 would fail a right answer).
PRELUDE = """\
import sys, time, itertools, collections, math, fractions, random, heapq, bisect, string, re
from itertools import accumulate, product, permutations, combinations
from collections import Counter, OrderedDict, deque, defaultdict, ChainMap
from functools import lru_cache, reduce, cmp_to_key
from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2
from typing import *
from heapq import *
sys.setrecursionlimit(10**6)
getattr(sys, "set_int_max_str_digits", lambda n: None)(0)
"""

# LeetCode's linked-list and tree helpers, as the public LeetCode RL dataset's tests call
# them (``is_same_list(candidate(head=list_node([1, 2])), list_node([2, 1]))``). Where a
# test uses one of these names and neither it nor its preamble defines it, the grader puts
# this definition on the tests' side (so the judging helper is never the program's) and on
# the program's (so ``Optional[ListNode]`` in a signature resolves).
NODE_HELPERS = """\
inf = float("inf")


class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next


class TreeNode:
    def __init__(self, val=0, left=None, right=None):
        self.val = val
        self.left = left
        self.right = right


def list_node(values):
    head = None
    for v in reversed(list(values or [])):
        head = ListNode(v, head)
    return head


def is_same_list(a, b):
    while a is not None and b is not None:
        if a.val != b.val:
            return False
        a, b = a.next, b.next
    return a is None and b is None


def tree_node(values):
    # Level order, None for a missing child, as LeetCode writes trees: [1, None, 2].
    values = list(values or [])
    if not values or values[0] is None:
        return None
    root = TreeNode(values[0])
    level, i = [root], 1
    while level and i < len(values):
        below = []
        for node in level:
            for side in ("left", "right"):
                if i < len(values) and values[i] is not None:
                    child = TreeNode(values[i])
                    setattr(node, side, child)
                    below.append(child)
                i += 1
        level = below
    return root


def is_same_tree(a, b):
    pairs = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if x is None or y is None:
            if x is not y:
                return False
            continue
        if x.val != y.val:
            return False
        pairs += [(x.left, y.left), (x.right, y.right)]
    return True
"""
NODE_HELPER_NAMES = frozenset(
    {"inf", "ListNode", "TreeNode", "list_node", "is_same_list", "tree_node", "is_same_tree"}
)
