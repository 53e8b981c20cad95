"""Same numbers as other code: the code before a regrouping, verl's and TRL's formulas."""
