"""miniverl.reporting"""
