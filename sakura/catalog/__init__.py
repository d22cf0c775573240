"""Templates: manifest loading, images, masks and task kinds.

>>> from sakura.catalog import load_catalog
>>> cat = load_catalog()                    # the embedded catalog (templates_catalog/catalog.toml)
>>> t = cat.get("fs-astronaut")
>>> t.image().shape, t.mask().shape, t.token_mask().shape
((256, 256, 3), (256, 256), (1024,))
"""

from .errors import CatalogError, UnknownTemplateError
from .images import ImageSpec, load_image_spec
from .manifest import (
    DEFAULT_MODEL,
    NATIVE_RESOLUTION,
    PATCH,
    TASK_NAMES,
    TASKS,
    Catalog,
    Request,
    Template,
    default_catalog_path,
    load_catalog,
    parse_catalog,
)
from .masks import MaskSpec, token_mask

__all__ = [
    "Catalog", "CatalogError", "DEFAULT_MODEL", "ImageSpec", "MaskSpec", "NATIVE_RESOLUTION", "PATCH",
    "Request", "TASKS", "TASK_NAMES", "Template", "UnknownTemplateError", "default_catalog_path",
    "load_catalog", "load_image_spec", "parse_catalog", "token_mask",
]
