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
