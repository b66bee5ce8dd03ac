"""What `reflow status` draws."""


def test_status_view_shows_progress():
    from rich.console import Console

    from reflow_cli.view import status_view

    console = Console(width=120, record=True)
    console.print(
        status_view(
            {
                "run": "r",
                "state": "RUNNING",
                "step": 10,
                "total_steps": 40,
                "workers": [],
                "layout": {},
            }
        )
    )
    text = console.export_text()
    assert "[##########" + "." * 30 + "] 25% of 40 steps" in text


def test_status_view_shows_the_attempt_and_checkpoints():
    from rich.console import Console

    from reflow_cli.view import status_view

    console = Console(width=160, record=True)
    console.print(
        status_view(
            {
                "run": "r",
                "state": "RUNNING",
                "step": 13,
                "total_steps": 40,
                "workers": [],
                "layout": {},
                "attempt": 2,
                "resumed": {"from": "step-00000008", "step": 8},
                "checkpoint": {"last": {"step": 12}, "failed": 1, "pending": None},
            }
        )
    )
    text = console.export_text()
    assert "attempt 2 (resumed from step-00000008); last checkpoint: step 12; 1 failed" in text


def test_status_view_says_who_waits_on_whom():
    from rich.console import Console

    from reflow_cli.view import status_view

    console = Console(width=200, record=True)
    label = "training batch 7 with trainer ranks [0, 1] (for 3.2 s)"
    worker = {"rank": 1, "node": "n", "pid": 5, "role": "trainer", "state": "busy"}
    console.print(
        status_view(
            {
                "run": "r",
                "state": "RUNNING",
                "step": 6,
                "total_steps": 40,
                "workers": [{**worker, "heartbeat_age_s": 3.2, "waiting_on": label}],
                "layout": {},
                "waits": [
                    {
                        "what": "the step report of batch 7",
                        "from": [0],
                        "for_s": 3.4,
                        "bound": "control.step_timeout_s=3600 (the run fails)",
                    }
                ],
            }
        )
    )
    text = console.export_text()
    assert label in text
    assert (
        "rank 0 waits on the step report of batch 7 from ranks [0] for 3.4 s "
        "(bound: control.step_timeout_s=3600 (the run fails))"
    ) in text


def test_status_view_shows_the_trainers_lends():
    from rich.console import Console

    from reflow_cli.view import status_view

    lends = {"lent_now": 2, "lends": 3, "paid": 2, "margin": 1.4, "lend_s": 8.2, "reclaim_s": 2.1}
    base = {
        "run": "r",
        "state": "RUNNING",
        "step": 1,
        "total_steps": 4,
        "workers": [],
        "layout": {},
    }
    console = Console(width=160, record=True)
    console.print(status_view({**base, "lends": lends}))
    console.print(status_view({**base, "lends": None}))
    text = console.export_text()
    assert text.count("lends:") == 1
    assert "lends: 2 trainer group(s) lent now; 3 done, 2 paid; margin 1.4" in text
    assert "switch 8.2 s out, 2.1 s back" in text
