"""Figure and viewer helpers of the chapters, one module per chapter: the drawing code a chapter
would otherwise carry in its cells, so that the page shows the mechanism and not the plotting."""
