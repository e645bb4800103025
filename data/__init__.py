"""Files that ship inside the reach_nb package as `reach_nb.data`: the knowledge base (kb/), the eval tasks
(eval/), the example pipeline (pipelines/) and the labelled sets (memory/, router/). Read them with
`reach_nb.config.shipped`."""
