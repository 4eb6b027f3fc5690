"""quantbench: which quant of a mixture-of-experts model should I use on this GPU?"""

__version__ = "0.1.0"
