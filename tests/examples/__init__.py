"""Tests of treadle/examples/ (the research gallery: test_research.py, test_research_b.py)."""
