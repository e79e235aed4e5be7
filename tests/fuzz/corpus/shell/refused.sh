echo $(whoami) <<EOF
*.md
