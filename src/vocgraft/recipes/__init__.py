"""Recipes: whole jobs (expand a model, ...) as readable end-to-end functions built from the stages."""
