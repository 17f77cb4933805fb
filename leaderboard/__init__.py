"""MLflow runs -> a static leaderboard site (HTML + a Markdown twin, tables and figures).

``python -m leaderboard build [--tracking-uri URI] [--out DIR | --publish] [--experiments NAME ...]``

- ``runs``     reads the runs of an MLflow store (``mlflow.search_runs``) into ``RunRecord``s
- ``papers``   reads the papers' reported numbers (``benchmarks/<paper>/paper_numbers.yaml``)
- ``tasks``    what a run was asked to solve (its ``task`` tag, else its params): only like with like
- ``stats``    paired-by-seed and Welch t-tests, Holm, two one-sided tests, detectable effects (scipy)
- ``claims``   the papers' claims (``benchmarks/<paper>/claims.yaml``) judged on the runs, paired by seed
- ``tables``   one table per (suite, benchmark, task, client test); seeds -> rows; ★ / ≈ verdicts
- ``summary``  per suite: the algorithm x benchmark matrix, gains over FedAvg, variants vs their control
- ``views``    tables as rows of cells (``view_cells``), shared by the HTML and the Markdown twin;
               ``row_facts``: what a row ran with; ``suite_views``: index, matrix, gains, controls;
               ``markdown``: a view as a Markdown table
- ``figures``  matplotlib figures (Agg, no pyplot): curves, client distributions, Pareto
- ``site``     renders the Jinja2 templates into the site and its Markdown twin

Importing the package loads nothing else. A store is read without creating or altering it by
``fl_lightning.records.read_only_store`` (standard library only), which the runner's ``--dry-run`` shares.
"""

__all__ = ["LeaderboardError"]


def __getattr__(name: str):
    if name == "LeaderboardError":
        from leaderboard.runs import LeaderboardError

        return LeaderboardError
    raise AttributeError(f"module 'leaderboard' has no attribute {name!r}")
