"""The prelude: what every program, and every test run beside or instead of it, starts with."""

# Imports APPS's own grader gives every program (minus numpy, absent from the sandbox's
# interpreter), so solutions written against that grader run unchanged.
PRELUDE = """\
import sys, time, itertools, collections, math, fractions, random, heapq, bisect, string, re
from itertools import accumulate, product, permutations, combinations
from collections import Counter, OrderedDict, deque, defaultdict, ChainMap
from functools import lru_cache, reduce, cmp_to_key
from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2
from typing import *
from heapq import *
sys.setrecursionlimit(10**6)
"""
