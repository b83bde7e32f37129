"""detectron2's ``model_zoo`` names for the configs that ship with treadle
(in ``configs/`` here; see :mod:`treadle.config.zoo`)."""

from treadle.config.zoo import get_config, get_config_file, shipped_configs

__all__ = ["get_config", "get_config_file", "shipped_configs"]
