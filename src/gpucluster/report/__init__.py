"""What a person looks at: the fabric diagram (SVG), the HTML plan, terminal output and progress.

Reads the compiled cluster (spec + plan) only; nothing here plans, renders configs or writes outside
the paths it is given.
"""
