"""The pair and its life: serving (DualIndex), migration, cutover, status, probe."""
