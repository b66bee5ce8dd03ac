"""Token-aware admission and routing of generation requests (the fast path).

Each rollout worker has a token budget (its KV capacity). The router predicts each
worker's active token load as the sum of its admitted requests' footprints, a footprint
being the prompt length plus the expected response length of that workload (an EWMA of
recent responses). A request is admitted to worker ``i`` only if

- ``load_i + footprint <= budget_i`` (never overcommit the budget),
- the worker's observed utilisation is at most ``admission_limit``, and
- its active generations are below its concurrency cap (AIMD): its admitted requests
  less those the rank reports waiting on a tool call (they hold no generation slot);

among the feasible workers the cost is ``load/budget + w_queue * queue + lambda_p *
preemption_pressure``, lowest wins. Siblings of one prompt (a GRPO group) go to the worker
that has their group when it is feasible and not much costlier than the best
(``affinity_slack``): they share the prompt's prefix cache, so a sibling placed with its
group books only its response tokens. Under overload they spill over (booking the whole
footprint where they land).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WorkerLoad:
    budget: int
    cap: int
    load: int = 0  # predicted active tokens
    active: int = 0
    queue: int = 0  # waiting requests reported by the engine
    util: float = 0.0  # observed KV utilisation
    pressure: float = 0.0  # smoothed preemption growth
    groups: set[int] = field(default_factory=set)


@dataclass
class RouterSettings:
    admission_limit: float = 0.95
    w_queue: float = 0.05
    lambda_p: float = 0.5
    affinity_slack: float = 0.5
    response_prior: int = 256  # expected response tokens before any is observed
    smoothing: float = 0.1


class TokenRouter:
    """Pull-based: the rank that asks for work is the candidate; :meth:`admit` says whether
    it may take a request. (Push routing to the cheapest worker, which the runtime does not
    do, lives with the benchmark that compares it: benchmarks/push_router.py.)"""

    def __init__(self, settings: RouterSettings | None = None) -> None:
        self.s = settings or RouterSettings()
        self.workers: dict[int, WorkerLoad] = {}
        self.expected_response: dict[str, float] = {}
        self._placed: dict[int, tuple[int, int]] = {}  # request id -> (worker, tokens)
        self._group_home: dict[int, int] = {}

    # --- worker state ------------------------------------------------------------------

    def add_worker(self, worker: int, budget: int, cap: int) -> None:
        self.workers[worker] = WorkerLoad(budget=budget, cap=cap)
        self._touch(worker)

    def remove_worker(self, worker: int) -> list[int]:
        """The worker left: its requests are forgotten (the caller requeues them)."""
        self.workers.pop(worker, None)
        gone = [r for r, (w, _) in self._placed.items() if w == worker]
        for r in gone:
            del self._placed[r]
        self._group_home = {g: w for g, w in self._group_home.items() if w != worker}
        return gone

    def observe(self, worker: int, *, util: float, queue: int, pressure: float, cap: int) -> None:
        w = self.workers[worker]
        w.util, w.queue, w.pressure, w.cap = util, queue, pressure, cap
        self._touch(worker)

    def _touch(self, worker: int) -> None:
        """A worker's cost changed (a subclass that indexes costs hooks in here)."""

    # --- requests ----------------------------------------------------------------------

    def footprint(self, prompt_tokens: int, workload: str = "default") -> int:
        return prompt_tokens + int(self.expected_response.get(workload, self.s.response_prior))

    def cost(self, w: WorkerLoad) -> float:
        return w.load / w.budget + self.s.w_queue * w.queue + self.s.lambda_p * w.pressure

    def feasible(self, w: WorkerLoad, footprint: int, in_tools: int = 0) -> bool:
        """Whether ``footprint`` more tokens fit ``w``; ``in_tools`` of its active requests
        wait on a tool call and do not count against its cap."""
        return (
            w.load + footprint <= w.budget
            and w.util <= self.s.admission_limit
            and w.active - in_tools < w.cap
        )

    def admit(
        self,
        worker: int,
        request: int,
        group: int,
        prompt_tokens: int,
        workload: str = "default",
        *,
        in_tools: int = 0,
    ) -> bool:
        """Pull-based admission: may ``worker`` (which asks for work) take this request?
        Booked if so; a sibling of a group already there books only its response.
        ``in_tools``: the worker's requests waiting on a tool call (not generating)."""
        w = self.workers.get(worker)
        if w is None:
            return False
        need = self.footprint(prompt_tokens, workload)
        if self._group_home.get(group) == worker:
            need -= prompt_tokens
        if not self.feasible(w, need, in_tools):
            return False
        self._book(request, group, worker, need)
        return True

    def _book(self, request: int, group: int, worker: int, tokens: int) -> int:
        w = self.workers[worker]
        w.load += tokens
        w.active += 1
        w.groups.add(group)
        self._placed[request] = (worker, tokens)
        self._group_home.setdefault(group, worker)
        self._touch(worker)
        return worker

    def finished(
        self, request: int, response_tokens: int | None, workload: str = "default"
    ) -> None:
        """A request ended (``response_tokens`` None: aborted); its load is released."""
        placed = self._placed.pop(request, None)
        if placed is not None and placed[0] in self.workers:
            w = self.workers[placed[0]]
            w.load -= placed[1]
            w.active -= 1
            self._touch(placed[0])
        if response_tokens is not None:
            prev = self.expected_response.get(workload, float(self.s.response_prior))
            a = self.s.smoothing
            self.expected_response[workload] = a * response_tokens + (1 - a) * prev
