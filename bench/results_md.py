"""bench/RESULTS.md: new sections go first, under the file's title, newest on top."""
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def add_section(section, path=PATH):
    text = open(path).read()
    head, sep, rest = text.partition("\n## ")
    open(path, "w").write(head.rstrip("\n") + "\n\n" + section + ("## " + rest if sep else ""))
