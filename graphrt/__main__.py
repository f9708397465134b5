from graphrt.cli import main

main()
