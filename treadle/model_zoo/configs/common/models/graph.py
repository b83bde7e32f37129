"""LiBai's ``graph`` node: ``graph = get_config("common/models/graph.py").graph``.

``graph.enabled=True`` trains with treadle's ``CompiledStep`` (LiBai's graph
mode; ``torch.compile`` here), as ``train.step.kind="compiled"`` does; False,
the default, with the eager step. LiBai's other graph keys have no meaning
in treadle and are refused when the job is checked.
"""

graph = dict(enabled=False)
