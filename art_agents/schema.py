"""The base of every typed model in the package."""

from pydantic import BaseModel, ConfigDict


class Schema(BaseModel):
    """Builds its validator on first use rather than at import, which keeps `import art_agents` fast."""

    model_config = ConfigDict(defer_build=True)
