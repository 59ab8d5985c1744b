"""OpenPipe ART compatibility: ART's import paths and argument shapes over our own API, all in this folder.

- `arguments`: ART's keyword arguments translated into ours. The core calls it at one point each:
  `Model`'s validator, `TrainableModel.register` (an `_internal_config` set after construction) and
  `RemoteBackend.train`.
- `dev`, `local`, `langgraph`, `rewards`, `utils` (with `utils.sft`): ART's `art.dev`, `art.local`,
  `art.langgraph`, `art.rewards` and `art.utils`. `art_agents/__init__.py` puts this folder on the package's path, so
  they are imported as `art_agents.local` and so on, the paths an ART program uses once `art` is renamed.
  Import them only by those paths: as `art_agents.art.local` they would load a second time.

This folder may import from the parts above the core (`art_agents.langgraph` wraps the LangGraph
integration, `art_agents.rewards` re-exports RULER): it is ART's face over the whole package.
"""
