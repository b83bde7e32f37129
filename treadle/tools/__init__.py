"""Command-line jobs (the top layer): ``treadle-train`` is ``treadle.tools.train_net``,
``treadle-plot`` is ``treadle.tools.plot_metrics``."""
