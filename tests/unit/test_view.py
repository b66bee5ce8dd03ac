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
