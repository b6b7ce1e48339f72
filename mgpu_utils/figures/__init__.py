"""Every figure and widget of the course (lessons 00-12), one module per topic; each function returns the matplotlib
Figure (end the cell with ``;``) or an ipywidgets box with a static view."""
