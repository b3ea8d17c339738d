from modulelens.interfaces.cli import main

main()
