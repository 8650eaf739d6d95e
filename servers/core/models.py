"""The base of the project's pydantic models.

`Model` is pydantic's BaseModel built on first use (defer_build): a server start defines a few hundred models (each
tool's inputs and results, the engines' records) and a call uses a handful, so building every validator and
serializer at import would be most of what a start costs (issue 14: cold start). Nothing else differs: a model is
built, with the same validation, the first time it validates, serializes or gives its schema.
"""

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    model_config = ConfigDict(defer_build=True)
