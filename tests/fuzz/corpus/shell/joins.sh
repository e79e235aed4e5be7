cat notes/a.md | grep -i todo | wc -l > out.txt 2>&1; state idle || echo no
# comment
